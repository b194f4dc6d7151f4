// Where the default model lives: $SLUICE_MODEL if set, else the file `./sluice fetch-model`
// writes, ${XDG_CACHE_HOME:-$HOME/.cache}/sluice/models/SmolLM2-135M-Instruct.Q4_1.gguf.
#ifndef SLUICE_MODEL_MODEL_PATH_H_
#define SLUICE_MODEL_MODEL_PATH_H_

#include <string>

namespace sluice::model {

std::string DefaultModelPath();

// Where `./sluice calibrate` keeps the transform-coded wire's calibration of a model: beside
// it, its name without ".gguf" plus ".kvtc".
std::string KvCalibrationPath(const std::string& model_path);

}  // namespace sluice::model

#endif  // SLUICE_MODEL_MODEL_PATH_H_
