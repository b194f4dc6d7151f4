// fp8 types and conversions, for code compiled for the CPU emulation of CUDA (kernels/cuda/emu).
#pragma once
#include "kernels/cuda/emu/fp_types.h"
