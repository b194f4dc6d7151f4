// The CUDA runtime API, for code compiled for the CPU emulation of CUDA (kernels/cuda/emu).
#pragma once
#include "kernels/cuda/emu/runtime.h"
