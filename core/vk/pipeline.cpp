// Pipeline creation from embedded SPIR-V, with specialization constants and a persisted cache.
#include "vk/pipeline.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "atomic_file.h"
#include "shader_registry.h"

namespace vkllm {
namespace {

// The format of each of the first `n` bindings (set 0) that the module declares as a storage
// texel buffer (an OpVariable of an OpTypeImage with Dim Buffer and Sampled 2), else UNDEFINED,
// and its descriptor count: the length of the array the binding is declared as (1 if none).
std::vector<BindingShape> reflect_bindings(const uint32_t* code, size_t n_words, uint32_t n, const std::string& name) {
  constexpr uint32_t kDecorate = 71, kTypeImage = 25, kTypeArray = 28, kTypePointer = 32, kConstant = 43, kVariable = 59;
  constexpr uint32_t kDecorationBinding = 33, kDimBuffer = 5, kFormatRgba32ui = 30, kFormatR32ui = 33;
  std::map<uint32_t, uint32_t> binding_of, pointee, var_type, constant;
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> array_of;  // array type: (element type, length id)
  std::map<uint32_t, VkFormat> image_format;
  for (size_t at = 5; at < n_words;) {
    const uint32_t op = code[at] & 0xFFFFu, len = code[at] >> 16;
    VKLLM_CHECK(len > 0 && at + len <= n_words, name + ": malformed SPIR-V at word " + std::to_string(at));
    const uint32_t* w = code + at;
    if (op == kDecorate && len >= 4 && w[2] == kDecorationBinding) binding_of[w[1]] = w[3];
    if (op == kTypeImage && len >= 9 && w[3] == kDimBuffer && w[7] == 2)
      image_format[w[1]] = w[8] == kFormatRgba32ui ? VK_FORMAT_R32G32B32A32_UINT
                           : w[8] == kFormatR32ui  ? VK_FORMAT_R32_UINT
                                                   : VK_FORMAT_UNDEFINED;
    if (op == kTypeArray && len >= 4) array_of[w[1]] = {w[2], w[3]};
    if (op == kConstant && len >= 4) constant[w[2]] = w[3];
    if (op == kTypePointer && len >= 4) pointee[w[1]] = w[3];
    if (op == kVariable && len >= 3) var_type[w[2]] = w[1];
    at += len;
  }
  std::vector<BindingShape> shapes(n);
  for (const auto& [var, ptr] : var_type) {
    const auto binding = binding_of.find(var);
    if (binding == binding_of.end() || binding->second >= n || !pointee.count(ptr)) continue;
    uint32_t type = pointee[ptr];
    BindingShape& b = shapes[binding->second];
    if (const auto arr = array_of.find(type); arr != array_of.end()) {
      VKLLM_CHECK(constant.count(arr->second.second), name + ": binding " + std::to_string(binding->second) +
                                                          " is an array of a length that is not a constant");
      b.count = constant[arr->second.second];
      type = arr->second.first;
    }
    const auto image = image_format.find(type);
    if (image == image_format.end()) continue;
    VKLLM_CHECK(image->second != VK_FORMAT_UNDEFINED, name + ": texel buffer binding " + std::to_string(binding->second) +
                                                          " is neither r32ui nor rgba32ui");
    b.format = image->second;
  }
  return shapes;
}

}  // namespace

Pipeline::Pipeline(const VulkanContext& ctx, VkPipelineCache cache, const std::string& shader, uint32_t n_buffers,
                   uint32_t push_size, const std::vector<uint32_t>& spec)
    : ctx_(ctx), name_(shader), n_buffers_(n_buffers), push_size_(push_size) {
  const shaders::Module* m = shaders::find(shader);
  VKLLM_CHECK(m != nullptr, "no embedded shader named '" + shader + "'");
  VKLLM_CHECK(!spec.empty(), "specialization constant 0 (workgroup size) is required");
  workgroup_size_ = spec[0];
  VKLLM_CHECK(push_size <= ctx.limits().maxPushConstantsSize, "push constants too large for " + shader);

  VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smci.codeSize = m->n_words * sizeof(uint32_t);
  smci.pCode = m->code;
  VK_CHECK(vkCreateShaderModule(ctx.device(), &smci, nullptr, &module_));

  bindings_ = reflect_bindings(m->code, m->n_words, n_buffers, shader);
  std::vector<VkDescriptorSetLayoutBinding> bindings(n_buffers);
  for (uint32_t i = 0; i < n_buffers; ++i) {
    const VkDescriptorType type =
        bindings_[i].format != VK_FORMAT_UNDEFINED ? VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    bindings[i] = {i, type, bindings_[i].count, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    n_views_ += bindings_[i].count;
  }
  VKLLM_CHECK(n_views_ <= ctx.info().max_push_descriptors,
              shader + ": " + std::to_string(n_views_) + " descriptors, the device pushes at most " +
                  std::to_string(ctx.info().max_push_descriptors));
  VkDescriptorSetLayoutCreateInfo dslci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  dslci.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  dslci.bindingCount = n_buffers;
  dslci.pBindings = bindings.data();
  VK_CHECK(vkCreateDescriptorSetLayout(ctx.device(), &dslci, nullptr, &set_layout_));

  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size};
  VkPipelineLayoutCreateInfo plci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  plci.setLayoutCount = 1;
  plci.pSetLayouts = &set_layout_;
  plci.pushConstantRangeCount = push_size ? 1 : 0;
  plci.pPushConstantRanges = &pcr;
  VK_CHECK(vkCreatePipelineLayout(ctx.device(), &plci, nullptr, &layout_));

  std::vector<VkSpecializationMapEntry> entries(spec.size());
  for (uint32_t i = 0; i < spec.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo si{static_cast<uint32_t>(entries.size()), entries.data(), spec.size() * 4, spec.data()};
  VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  cpci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  cpci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  cpci.stage.module = module_;
  cpci.stage.pName = "main";
  cpci.stage.pSpecializationInfo = &si;
  cpci.layout = layout_;
  VK_CHECK(vkCreateComputePipelines(ctx.device(), cache, 1, &cpci, nullptr, &pipeline_));
  ctx.set_name(VK_OBJECT_TYPE_PIPELINE, reinterpret_cast<uint64_t>(pipeline_), shader);
}

Pipeline::~Pipeline() {
  VkDevice d = ctx_.device();
  if (pipeline_) vkDestroyPipeline(d, pipeline_, nullptr);
  if (layout_) vkDestroyPipelineLayout(d, layout_, nullptr);
  if (set_layout_) vkDestroyDescriptorSetLayout(d, set_layout_, nullptr);
  if (module_) vkDestroyShaderModule(d, module_, nullptr);
}

namespace {

// A pipeline cache blob is only handed to the driver when its header names this exact device
// (Vulkan spec: header length 32, version 1, vendor, device, UUID); anything else is ignored.
bool cache_blob_matches(const std::vector<char>& blob, const VkPhysicalDeviceProperties& p) {
  if (blob.size() < 32) return false;
  uint32_t header_len, version, vendor, device;
  std::memcpy(&header_len, blob.data(), 4);
  std::memcpy(&version, blob.data() + 4, 4);
  std::memcpy(&vendor, blob.data() + 8, 4);
  std::memcpy(&device, blob.data() + 12, 4);
  return header_len >= 32 && header_len <= blob.size() && version == VK_PIPELINE_CACHE_HEADER_VERSION_ONE &&
         vendor == p.vendorID && device == p.deviceID && std::memcmp(blob.data() + 16, p.pipelineCacheUUID, VK_UUID_SIZE) == 0;
}

}  // namespace

// The pipeline cache is a few MiB (lavapipe's JIT code for every kernel); past this it is not ours.
constexpr uint64_t k_max_pipeline_cache_bytes = uint64_t{1} << 30;

Pipelines::Pipelines(const VulkanContext& ctx, std::string cache_path) : ctx_(ctx), cache_path_(std::move(cache_path)) {
  std::vector<char> blob;
  if (!cache_path_.empty()) {
    // Only a regular file of a sane size is read (a directory there threw, a FIFO hung, a link to
    // /dev/zero grew without bound); anything else is a cold cache, and the save replaces it.
    std::error_code ec;
    const auto status = std::filesystem::status(cache_path_, ec);
    const uint64_t size = !ec && std::filesystem::is_regular_file(status) ? std::filesystem::file_size(cache_path_, ec) : 0;
    if (!ec && size > 0 && size <= k_max_pipeline_cache_bytes) {
      std::ifstream in(cache_path_, std::ios::binary);
      blob.resize(size);
      if (!in.read(blob.data(), std::streamsize(size))) blob.clear();
    }
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(ctx.physical(), &p);
    if (!cache_blob_matches(blob, p)) blob.clear();
  }
  VkPipelineCacheCreateInfo ci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  ci.initialDataSize = blob.size();
  ci.pInitialData = blob.empty() ? nullptr : blob.data();
  VK_CHECK(vkCreatePipelineCache(ctx.device(), &ci, nullptr, &cache_));
}

Pipelines::~Pipelines() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();  // each finishes the one it is making (a driver call cannot be cut short)
  pipelines_.clear();
  if (!cache_path_.empty()) {
    size_t n = 0;
    if (vkGetPipelineCacheData(ctx_.device(), cache_, &n, nullptr) == VK_SUCCESS && n > 0) {
      std::vector<uint8_t> data(n);
      if (vkGetPipelineCacheData(ctx_.device(), cache_, &n, data.data()) == VK_SUCCESS) {
        data.resize(n);
        std::error_code ec;
        std::filesystem::create_directories(std::filesystem::path(cache_path_).parent_path(), ec);
        try {
          gguf::write_file_atomic(cache_path_, data);
        } catch (const std::exception&) {
          // A cache that cannot be saved only costs start-up time next run.
        }
      }
    }
  }
  vkDestroyPipelineCache(ctx_.device(), cache_, nullptr);
}

std::string PipelineSpec::key() const {
  std::string k = shader;
  for (uint32_t v : spec) k += ":" + std::to_string(v);
  return k;
}

void Pipelines::make(Entry& e, const PipelineSpec& s) {
  std::unique_ptr<Pipeline> p;
  std::exception_ptr error;
  try {
    p = std::make_unique<Pipeline>(ctx_, cache_, s.shader, s.n_buffers, s.push_size, s.spec);
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard lock(mu_);
    e.pipeline = std::move(p);
    e.error = error;
    e.state = Entry::State::Done;
  }
  made_.notify_all();
}

const Pipeline& Pipelines::get(const PipelineSpec& s) {
  std::unique_lock lock(mu_);
  auto [it, added] = pipelines_.try_emplace(s.key());
  Entry& e = it->second;
  // A failure is not kept: a later request tries again (a preparing thread may have failed for
  // want of memory while the weights uploaded).
  if (added || e.state == Entry::State::Queued || (e.state == Entry::State::Done && e.error)) {
    e.state = Entry::State::Making;
    lock.unlock();
    make(e, s);
    lock.lock();
  } else {
    made_.wait(lock, [&] { return e.state == Entry::State::Done; });
  }
  if (e.error) std::rethrow_exception(e.error);
  return *e.pipeline;
}

void Pipelines::prepare(const std::vector<PipelineSpec>& specs) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  for (const PipelineSpec& s : specs) {
    auto [it, added] = pipelines_.try_emplace(s.key());
    if (!added) continue;
    it->second.state = Entry::State::Queued;
    queue_.emplace_back(&it->second, s);
  }
  const size_t cpus = std::max(1u, std::thread::hardware_concurrency());
  for (; active_workers_ < std::min(cpus, queue_.size()); ++active_workers_) workers_.emplace_back([this] { prepare_worker(); });
}

void Pipelines::prepare_worker() {
  std::unique_lock lock(mu_);
  while (!stopping_ && !queue_.empty()) {
    auto [e, s] = std::move(queue_.front());
    queue_.pop_front();
    if (e->state != Entry::State::Queued) continue;  // get() made it
    e->state = Entry::State::Making;
    lock.unlock();
    make(*e, s);
    lock.lock();
  }
  --active_workers_;
  made_.notify_all();
}

std::vector<std::string> Pipelines::made() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [key, e] : pipelines_)
    if (e.pipeline) keys.push_back(key);
  return keys;
}

void Pipelines::wait_prepared() {
  std::unique_lock lock(mu_);
  made_.wait(lock, [&] { return active_workers_ == 0; });
}

}  // namespace vkllm
