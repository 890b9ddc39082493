// The backed mode (runtime/backed/): how the runtime mode selection finds and makes it.
#pragma once

#include <c10/core/DeviceType.h>
#include <flagos/loader.h>

#include <memory>
#include <optional>

#include "runtime/graph.h"

namespace flagos::runtime {
class RuntimeMode;
}

namespace flagos::runtime::backed_mode {

// The torch device type that backs HAL `table` in this torch build (CUDA for the cuda HAL when torch has
// CUDA), or nullopt: then flagos runs its own runtime on the HAL. May throw when torch cannot use the type.
std::optional<c10::DeviceType> backing_type_for(const hal::HalTable& table);

RuntimeMode* make_mode(c10::DeviceType type);

// Graphs of the backing type (backed_graph.cpp: CUDA's when torch has CUDA).
std::unique_ptr<DeviceGraph> new_backing_graph(c10::DeviceType type, bool keep_graph);
c10::MempoolId_t backing_graph_pool_handle(c10::DeviceType type);
// Whether work issued to a stream of the backing type is being captured.
bool backing_stream_is_capturing(const c10::Stream& backing);

}  // namespace flagos::runtime::backed_mode
