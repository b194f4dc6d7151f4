// cub::BlockReduce, for code compiled for the CPU emulation of CUDA (kernels/cuda/emu).
#pragma once
#include "kernels/cuda/emu/cub.h"
