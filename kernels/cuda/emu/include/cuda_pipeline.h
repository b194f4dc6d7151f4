// The pipeline (cp.async) primitives, for code compiled for the CPU emulation of CUDA
// (kernels/cuda/emu).
#pragma once
#include "kernels/cuda/emu/device.h"
