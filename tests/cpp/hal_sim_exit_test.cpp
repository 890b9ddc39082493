// Leaving main() with work still queued on sim streams must neither hang nor crash: the stream workers
// are detached and every object they touch is intentionally never destroyed. ctest checks the exit code
// and a timeout.
#include <flagos/loader.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace {

void sleep_a_while(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

}  // namespace

int main() {
  std::string error;
  const flagos::hal::HalTable* sim = flagos::hal::load_hal("sim", &error);
  if (sim == nullptr) {
    std::fprintf(stderr, "cannot load the sim HAL: %s\n", error.c_str());
    return 1;
  }
  static unsigned char upload[1 << 16];
  void* device = nullptr;
  flagos_stream_t stream = nullptr;
  flagos_stream_t destroyed = nullptr;
  if (sim->malloc(0, &device, sizeof(upload)) != FLAGOS_SUCCESS ||
      sim->stream_create(0, 0, &stream) != FLAGOS_SUCCESS ||
      sim->stream_create(1, -1, &destroyed) != FLAGOS_SUCCESS) {
    std::fprintf(stderr, "setup failed: %s\n", sim->get_last_error_message());
    return 1;
  }
  for (int i = 0; i < 3; ++i) {
    sim->launch_host_func(stream, sleep_a_while, nullptr);
    sim->memset_async(device, i, sizeof(upload), stream);
    sim->launch_host_func(nullptr, sleep_a_while, nullptr);
    sim->launch_host_func(destroyed, sleep_a_while, nullptr);
  }
  sim->stream_destroy(destroyed);
  std::puts("returning from main with work pending");
  return 0;
}
