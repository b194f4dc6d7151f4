// The CUDA runtime (nvcc includes it in every .cu), for code compiled for the CPU emulation of CUDA
// (kernels/cuda/emu).
#pragma once
#include "kernels/cuda/emu/runtime.h"
