// Graphs in the HAL mode (runtime/graph.h): a capture is a recording of the device work issued to the
// capturing stream. Nothing runs while capturing: the ops layer records each operator that reaches flagos
// (its kernels run on the host, so "device work" is the operator call itself) and allocates its results
// from the graph's pool; replay() issues the recorded work again, in order, on the same memory, on the
// current stream. Calls that would wait for the device or read its memory on the host fail the capture
// (runtime::capture::check_allowed), as they do under CUDA's stream capture.
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/graph.h"
#include "runtime/hal/hal_parts.h"
#include "runtime/hal/hal_streams.h"
#include "runtime/hal_runtime.h"

namespace flagos::runtime::hal_mode {
namespace {

// Pool ids, as CUDA makes them: a graph's own pool is {id, 0}, a graph_pool_handle() is {0, id}.
std::atomic<c10::CaptureId_t> g_next_pool_id{1};

class HalGraph final : public DeviceGraph, public capture::Recording {
 public:
  explicit HalGraph(bool /*keep_graph*/) {}
  ~HalGraph() override {
    try {
      reset();
    } catch (...) {  // a destructor must not throw; reset() only fails on a broken HAL
    }
  }

  void capture_begin(c10::MempoolId_t pool, CaptureErrorMode mode) override {
    TORCH_CHECK(!has_graph_ && !capturing_,
                "This FlagosGraph instance already owns a captured graph (or a capture underway). To capture "
                "a new graph, create a new instance or call reset() first.");
    const c10::DeviceIndex device = current_device();
    const c10::Stream stream = current_stream(device);
    TORCH_CHECK(stream != default_stream(device),
                "flagos graphs must be captured on a non-default stream. (However, after capture, it's ok "
                "to replay them on the default stream.)");
    pool_ = (pool.first != 0 || pool.second != 0) ? pool : c10::MempoolId_t{g_next_pool_id++, 0};
    device_ = device;
    stream_ = stream;
    steps_.clear();
    invalid_reason_.clear();
    begin_allocate_to_pool(device, pool_, stream.id());
    holds_pool_ = true;
    try {
      capture::begin(stream, this, mode);
    } catch (...) {
      end_allocate_to_pool(device, pool_);
      release();
      throw;
    }
    capturing_ = true;
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, "FlagosGraph::capture_end called without a capture underway");
    const c10::Stream stream = current_stream(device_);
    TORCH_CHECK(stream == stream_, "Capture must end on the same stream it began on.");
    capture::end(stream_);
    end_allocate_to_pool(device_, pool_);
    capturing_ = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!invalid_reason_.empty()) {
        steps_.clear();
        throw c10::AcceleratorError(
            {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, 901,
            "flagos error: operation failed due to a previous error during capture (" + invalid_reason_ +
                ")");
      }
    }
    has_graph_ = true;
    if (steps_.empty()) {
      TORCH_WARN(
          "The flagos graph is empty. This usually means that the graph was attempted to be captured on "
          "the wrong device or stream.");
    }
  }

  void instantiate() override {
    TORCH_CHECK(has_graph_, "FlagosGraph::instantiate called without a preceding successful capture");
  }

  void replay() override {
    TORCH_CHECK(has_graph_, "Called FlagosGraph::replay without a preceding successful capture.");
    c10::DeviceGuard device_guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
    for (Step& step : steps_) {
      try {
        step.run();
      } catch (c10::Error& e) {
        e.add_context("while replaying " + step.what + " of a flagos graph");
        throw;
      }
    }
  }

  void reset() override {
    if (capturing_) {
      capture::end(stream_);
      end_allocate_to_pool(device_, pool_);
      capturing_ = false;
    }
    steps_.clear();  // first: the steps reference the pool's memory
    has_graph_ = false;
    release();
  }

  c10::MempoolId_t pool() const override {
    TORCH_CHECK(capturing_ || has_graph_ || holds_pool_,
                "Called FlagosGraph::pool() without a preceding successful capture.");
    return pool_;
  }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "FlagosGraph::debug_dump: call enable_debug_mode() before capturing");
    TORCH_CHECK(has_graph_, "FlagosGraph::debug_dump called without a preceding successful capture");
    std::ofstream out(path);
    TORCH_CHECK(out, "FlagosGraph::debug_dump: cannot write '", path, "'");
    out << "flagos graph: " << steps_.size() << " steps on flagos:" << static_cast<int>(device_) << ", pool ("
        << pool_.first << ", " << pool_.second << ")\n";
    for (size_t i = 0; i < steps_.size(); ++i) out << i << "\t" << steps_[i].what << "\n";
  }

  void register_generator(const at::Generator& generator) override {
    // Recorded random ops draw from their generator when replayed, so each replay advances it and gets
    // fresh numbers; nothing is captured of its state.
    TORCH_CHECK(generator.defined() && generator.device().type() == c10::DeviceType::PrivateUse1,
                "register_generator_state expects a flagos generator, got one of ", generator.device());
  }

  // ---- capture::Recording
  void record(std::string what, std::function<void()> step) override {
    steps_.push_back({std::move(what), std::move(step)});
  }
  void invalidate(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (invalid_reason_.empty()) invalid_reason_ = reason;
  }
  c10::MempoolId_t pool_id() const override { return pool_; }
  bool in_pool(const void* ptr) const override { return hal_mode::in_pool(ptr, pool_); }

 private:
  struct Step {
    std::string what;
    std::function<void()> run;
  };

  void release() {
    if (!holds_pool_) return;
    holds_pool_ = false;
    release_pool(device_, pool_);
  }

  std::vector<Step> steps_;
  c10::MempoolId_t pool_{0, 0};
  c10::DeviceIndex device_ = 0;
  c10::Stream stream_{c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, 0), 0};
  bool capturing_ = false;
  bool has_graph_ = false;
  bool holds_pool_ = false;
  bool debug_ = false;
  std::mutex mu_;  // invalid_reason_: another thread's forbidden call may fail this capture
  std::string invalid_reason_;
};

}  // namespace

std::unique_ptr<DeviceGraph> new_graph(bool keep_graph) {
  return std::make_unique<HalGraph>(keep_graph);
}

c10::MempoolId_t graph_pool_handle() {
  return {0, g_next_pool_id++};
}

bool is_stream_capturing(const c10::Stream& stream) {
  return capture::recording_for(stream) != nullptr;
}

}  // namespace flagos::runtime::hal_mode
