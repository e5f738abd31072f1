// Parameter counts and type histogram of a GGUF model.
#include "model/summary.h"

namespace vkllm {

ModelSummary summarize_model(const gguf::File& f, const RopeOverrides& rope) {
  ModelSummary s;
  s.config = read_model_config(f, rope);
  s.file_size = f.file_size();
  s.gguf_version = f.version();
  s.n_tensors = f.tensors().size();
  for (const gguf::TensorInfo& t : f.tensors()) {
    s.n_params += t.n_elements;
    s.weight_bytes += t.n_bytes;
    const std::string type = gguf::type_name(t.type);
    s.type_counts[type] += 1;
    s.type_params[type] += t.n_elements;
  }
  return s;
}

}  // namespace vkllm
