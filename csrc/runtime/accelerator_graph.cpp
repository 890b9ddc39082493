// torch.accelerator.Graph on flagos (torch 2.13 and later): the generic graph API's implementation for
// PrivateUse1, over the selected mode's graph (runtime/graph.h). torch looks implementations up by
// c10::DeviceTypeName(type, /*lower_case=*/false), which for PrivateUse1 is the renamed backend's name
// upper-cased: "FLAGOS". torch 2.11 has no generic graph API; this file is empty there.
#if __has_include(<ATen/core/GraphImplInterface.h>)
#include <ATen/core/GraphImplInterface.h>

#include <memory>
#include <string>

#include "runtime/graph.h"

namespace flagos::runtime {
namespace {

CaptureErrorMode from_generic(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::Global:
      return CaptureErrorMode::kGlobal;
    case at::GraphCaptureMode::ThreadLocal:
      return CaptureErrorMode::kThreadLocal;
    case at::GraphCaptureMode::Relaxed:
      return CaptureErrorMode::kRelaxed;
    case at::GraphCaptureMode::Default:
      break;
  }
  return CaptureErrorMode::kDefault;
}

class FlagosAcceleratorGraph final : public at::GraphImplInterface {
 public:
  explicit FlagosAcceleratorGraph(const at::GraphImplArgs& args) : graph_(new_graph(args.keep_graph)) {}

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    graph_->capture_begin(pool, from_generic(mode));
  }
  void capture_end() override { graph_->capture_end(); }
  void instantiate() override { graph_->instantiate(); }
  void replay() override { graph_->replay(); }
  void reset() override { graph_->reset(); }
  c10::MempoolId_t pool() const override { return graph_->pool(); }
  void enable_debug_mode() override { graph_->enable_debug_mode(); }
  void debug_dump(const std::string& path) override { graph_->debug_dump(path); }

 private:
  std::unique_ptr<DeviceGraph> graph_;
};

}  // namespace
}  // namespace flagos::runtime

namespace at {
REGISTER_GRAPH_IMPL(FLAGOS, flagos::runtime::FlagosAcceleratorGraph);
}
#endif
