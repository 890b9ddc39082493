// HAL conformance, part 2: streams, host functions, events, and error handling. Runs against every built HAL.
#include <cstring>

#include "hal_test_util.h"

namespace flagos::hal::testing {
namespace {

class HalStreamsEvents : public HalTest {};
class HalErrors : public HalTest {};

struct OrderLog {
  std::vector<int>* entries;
  int value;
};

void append_to_log(void* entry) {
  auto* log = static_cast<OrderLog*>(entry);
  log->entries->push_back(log->value);
}

TEST_P(HalStreamsEvents, StreamBasics) {
  for (int device = 0; device < device_count(); ++device) {
    OwnedStream stream(hal(), device);
    ASSERT_HAL_OK(stream.status());
    int stream_device = -1;
    ASSERT_HAL_OK(hal()->stream_get_device(stream.get(), &stream_device));
    EXPECT_EQ(stream_device, device);
    EXPECT_HAL_OK(hal()->stream_query(stream.get()));
    EXPECT_HAL_OK(hal()->stream_synchronize(stream.get()));
    void* native = nullptr;
    EXPECT_HAL_OK(hal()->stream_get_native_handle(stream.get(), &native));

    flagos_stream_t default_stream = nullptr;
    ASSERT_HAL_OK(hal()->stream_get_default(device, &default_stream));
    ASSERT_NE(default_stream, nullptr);
    EXPECT_NE(default_stream, stream.get());
    flagos_stream_t again = nullptr;
    ASSERT_HAL_OK(hal()->stream_get_default(device, &again));
    EXPECT_EQ(again, default_stream);
    ASSERT_HAL_OK(hal()->stream_get_device(default_stream, &stream_device));
    EXPECT_EQ(stream_device, device);
    EXPECT_HAL_OK(hal()->stream_synchronize(default_stream));
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->stream_destroy(default_stream));
  }
  // NULL is the default stream of the current device.
  const int last = device_count() - 1;
  ASSERT_HAL_OK(hal()->set_device(last));
  int stream_device = -1;
  ASSERT_HAL_OK(hal()->stream_get_device(nullptr, &stream_device));
  EXPECT_EQ(stream_device, last);
  EXPECT_HAL_OK(hal()->stream_query(nullptr));
  EXPECT_HAL_OK(hal()->stream_synchronize(nullptr));
}

TEST_P(HalStreamsEvents, QueryReportsPendingWorkUntilSynchronized) {
  OwnedStream stream(hal(), 0);
  ASSERT_HAL_OK(stream.status());
  int delay_ms = 100;
  std::atomic<int> done{0};
  ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), set_flag, &done));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_NOT_READY, hal()->stream_query(stream.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  EXPECT_EQ(done.load(), 1);
  EXPECT_HAL_OK(hal()->stream_query(stream.get()));
}

TEST_P(HalStreamsEvents, HostFunctionsRunInQueueOrder) {
  constexpr int kCount = 64;
  OwnedStream stream(hal(), 0);
  ASSERT_HAL_OK(stream.status());
  std::vector<int> entries;
  std::vector<OrderLog> logs(kCount);
  for (int i = 0; i < kCount; ++i) {
    logs[i] = OrderLog{&entries, i};
    ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), append_to_log, &logs[i]));
  }
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  ASSERT_EQ(entries.size(), static_cast<size_t>(kCount));
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(entries[i], i);
}

TEST_P(HalStreamsEvents, PriorityRange) {
  int least = 1;
  int greatest = 1;
  ASSERT_HAL_OK(hal()->stream_get_priority_range(&least, &greatest));
  EXPECT_EQ(least, 0);
  EXPECT_LE(greatest, least);
  // Out-of-range priorities are clamped, not rejected.
  for (int priority : {least, greatest, greatest - 100, least + 100}) {
    SCOPED_TRACE("priority " + std::to_string(priority));
    OwnedStream stream(hal(), 0, priority);
    EXPECT_HAL_OK(stream.status());
  }
}

TEST_P(HalStreamsEvents, NeverRecordedEventIsComplete) {
  OwnedEvent event(hal());
  ASSERT_HAL_OK(event.status());
  EXPECT_HAL_OK(hal()->event_query(event.get()));
  EXPECT_HAL_OK(hal()->event_synchronize(event.get()));
}

TEST_P(HalStreamsEvents, RecordedEventCompletesInStreamOrder) {
  OwnedStream stream(hal(), 0);
  OwnedEvent event(hal());
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(event.status());
  int delay_ms = 100;
  std::atomic<int> done{0};
  ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), set_flag, &done));
  ASSERT_HAL_OK(hal()->event_record(event.get(), stream.get()));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_NOT_READY, hal()->event_query(event.get()));
  ASSERT_HAL_OK(hal()->event_synchronize(event.get()));
  EXPECT_EQ(done.load(), 1);
  EXPECT_HAL_OK(hal()->event_query(event.get()));
  // Recording on the NULL stream (current device's default) works too.
  ASSERT_HAL_OK(hal()->event_record(event.get(), nullptr));
  ASSERT_HAL_OK(hal()->event_synchronize(event.get()));
  EXPECT_HAL_OK(hal()->event_query(event.get()));
}

// An event and its stream agree: once the stream's last event is complete the stream is idle, and once the
// stream is synchronised its events are complete (the sim HAL once let a query see one before the other).
TEST_P(HalStreamsEvents, StreamAndItsLastEventCompleteTogether) {
  OwnedStream stream(hal(), 0);
  OwnedEvent event(hal(), FLAGOS_EVENT_DISABLE_TIMING);
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(event.status());
  std::atomic<int> done{0};
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE(round);
    ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), set_flag, &done));
    ASSERT_HAL_OK(hal()->event_record(event.get(), stream.get()));
    if (round % 2 == 0) {
      ASSERT_HAL_OK(hal()->event_synchronize(event.get()));
      ASSERT_HAL_OK(hal()->stream_query(stream.get()));
    } else {
      ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
      ASSERT_HAL_OK(hal()->event_query(event.get()));
    }
  }
}

TEST_P(HalStreamsEvents, QueryFollowsTheLatestRecord) {
  OwnedStream slow(hal(), 0);
  OwnedStream idle(hal(), 0);
  OwnedEvent event(hal());
  ASSERT_HAL_OK(slow.status());
  ASSERT_HAL_OK(idle.status());
  ASSERT_HAL_OK(event.status());
  int delay_ms = 200;
  ASSERT_HAL_OK(hal()->event_record(event.get(), idle.get()));
  ASSERT_HAL_OK(hal()->event_synchronize(event.get()));
  ASSERT_HAL_OK(hal()->launch_host_func(slow.get(), sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->event_record(event.get(), slow.get()));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_NOT_READY, hal()->event_query(event.get()));
  ASSERT_HAL_OK(hal()->event_record(event.get(), idle.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(idle.get()));
  EXPECT_HAL_OK(hal()->event_query(event.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(slow.get()));
}

TEST_P(HalStreamsEvents, ElapsedTimeMeasuresQueuedWork) {
  OwnedStream stream(hal(), 0);
  OwnedEvent start(hal());
  OwnedEvent end(hal());
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(start.status());
  ASSERT_HAL_OK(end.status());
  int delay_ms = 60;
  ASSERT_HAL_OK(hal()->event_record(start.get(), stream.get()));
  ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->event_record(end.get(), stream.get()));
  float pending_ms = -1;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_NOT_READY, hal()->event_elapsed_time(&pending_ms, start.get(), end.get()));
  ASSERT_HAL_OK(hal()->event_synchronize(end.get()));
  float ms = -1;
  ASSERT_HAL_OK(hal()->event_elapsed_time(&ms, start.get(), end.get()));
  EXPECT_GE(ms, 50.0f);
  EXPECT_LT(ms, 5000.0f);
  float zero_ms = -1;
  ASSERT_HAL_OK(hal()->event_elapsed_time(&zero_ms, start.get(), start.get()));
  EXPECT_GE(zero_ms, 0.0f);
  EXPECT_LT(zero_ms, 1.0f);
}

TEST_P(HalStreamsEvents, ElapsedTimeNeedsTimingAndRecordedEvents) {
  OwnedEvent timed(hal());
  OwnedEvent untimed(hal(), FLAGOS_EVENT_DISABLE_TIMING);
  OwnedEvent never_recorded(hal());
  OwnedEvent blocking(hal(), FLAGOS_EVENT_BLOCKING_SYNC | FLAGOS_EVENT_DISABLE_TIMING);
  for (flagos_status_t status :
       {timed.status(), untimed.status(), never_recorded.status(), blocking.status()}) {
    ASSERT_HAL_OK(status);
  }
  ASSERT_HAL_OK(hal()->event_record(timed.get(), nullptr));
  ASSERT_HAL_OK(hal()->event_record(untimed.get(), nullptr));
  ASSERT_HAL_OK(hal()->event_record(blocking.get(), nullptr));
  ASSERT_HAL_OK(hal()->stream_synchronize(nullptr));
  ASSERT_HAL_OK(hal()->event_synchronize(blocking.get()));
  float ms = 0;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->event_elapsed_time(&ms, timed.get(), untimed.get()));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->event_elapsed_time(&ms, untimed.get(), timed.get()));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE,
                    hal()->event_elapsed_time(&ms, timed.get(), never_recorded.get()));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE, hal()->event_elapsed_time(nullptr, timed.get(), timed.get()));
}

TEST_P(HalStreamsEvents, StreamWaitsForEventRecordedOnAnotherStream) {
  OwnedStream producer(hal(), 0);
  OwnedStream consumer(hal(), 0);
  OwnedEvent event(hal(), FLAGOS_EVENT_DISABLE_TIMING);
  DeviceBuffer buffer(hal(), 0, 4096);
  PinnedBuffer result(hal(), 4096);
  for (flagos_status_t status :
       {producer.status(), consumer.status(), event.status(), buffer.status(), result.status()}) {
    ASSERT_HAL_OK(status);
  }
  ASSERT_HAL_OK(hal()->memset(buffer.data(), 0, 4096));
  std::memset(result.data(), 0, 4096);
  int delay_ms = 100;
  std::atomic<int> produced{0};
  FlagObservation observation{&produced};
  ASSERT_HAL_OK(hal()->launch_host_func(producer.get(), sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->memset_async(buffer.data(), 0x5E, 4096, producer.get()));
  ASSERT_HAL_OK(hal()->launch_host_func(producer.get(), set_flag, &produced));
  ASSERT_HAL_OK(hal()->event_record(event.get(), producer.get()));
  ASSERT_HAL_OK(hal()->stream_wait_event(consumer.get(), event.get()));
  ASSERT_HAL_OK(hal()->launch_host_func(consumer.get(), observe_flag, &observation));
  ASSERT_HAL_OK(
      hal()->memcpy_async(result.data(), buffer.data(), 4096, FLAGOS_MEMCPY_DEVICE_TO_HOST, consumer.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(consumer.get()));
  EXPECT_EQ(observation.observed.load(), 1);
  EXPECT_EQ(result.data()[0], 0x5E);
  EXPECT_EQ(result.data()[4095], 0x5E);
}

TEST_P(HalStreamsEvents, WaitingOnANeverRecordedEventDoesNotBlock) {
  OwnedStream stream(hal(), 0);
  OwnedEvent event(hal());
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(event.status());
  std::atomic<int> ran{0};
  ASSERT_HAL_OK(hal()->stream_wait_event(stream.get(), event.get()));
  ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), set_flag, &ran));
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  EXPECT_EQ(ran.load(), 1);
}

TEST_P(HalStreamsEvents, DestroyingAStreamLetsPendingWorkFinish) {
  flagos_stream_t stream = nullptr;
  ASSERT_HAL_OK(hal()->stream_create(0, 0, &stream));
  int delay_ms = 80;
  std::atomic<int> done{0};
  ASSERT_HAL_OK(hal()->launch_host_func(stream, sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->launch_host_func(stream, set_flag, &done));
  ASSERT_HAL_OK(hal()->stream_destroy(stream));
  ASSERT_HAL_OK(hal()->device_synchronize(0));
  EXPECT_EQ(done.load(), 1);
}

TEST_P(HalStreamsEvents, DeviceSynchronizeWaitsForEveryStreamOfTheDevice) {
  OwnedStream first(hal(), 0);
  OwnedStream second(hal(), 0);
  ASSERT_HAL_OK(first.status());
  ASSERT_HAL_OK(second.status());
  int delay_ms = 60;
  std::atomic<int> first_done{0};
  std::atomic<int> second_done{0};
  std::atomic<int> default_done{0};
  ASSERT_HAL_OK(hal()->launch_host_func(first.get(), sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->launch_host_func(first.get(), set_flag, &first_done));
  ASSERT_HAL_OK(hal()->launch_host_func(second.get(), sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->launch_host_func(second.get(), set_flag, &second_done));
  ASSERT_HAL_OK(hal()->launch_host_func(nullptr, sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->launch_host_func(nullptr, set_flag, &default_done));
  ASSERT_HAL_OK(hal()->device_synchronize(0));
  EXPECT_EQ(first_done.load(), 1);
  EXPECT_EQ(second_done.load(), 1);
  EXPECT_EQ(default_done.load(), 1);
}

TEST_P(HalStreamsEvents, EventsBelongToTheDeviceCurrentAtCreation) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  ASSERT_HAL_OK(hal()->set_device(1));
  OwnedEvent event(hal());
  ASSERT_HAL_OK(event.status());
  ASSERT_HAL_OK(hal()->set_device(0));
  OwnedStream on_first(hal(), 0);
  OwnedStream on_second(hal(), 1);
  ASSERT_HAL_OK(on_first.status());
  ASSERT_HAL_OK(on_second.status());
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->event_record(event.get(), on_first.get()));
  EXPECT_HAL_OK(hal()->event_record(event.get(), on_second.get()));
  // A stream may wait on an event of another device.
  EXPECT_HAL_OK(hal()->stream_wait_event(on_first.get(), event.get()));
  EXPECT_HAL_OK(hal()->stream_synchronize(on_first.get()));
}

TEST_P(HalErrors, BadDeviceIndexIsRejectedEverywhere) {
  for (int device : {-1, device_count(), 1000}) {
    SCOPED_TRACE("device " + std::to_string(device));
    flagos_device_properties_t props;
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    void* ptr = nullptr;
    flagos_stream_t stream = nullptr;
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE, hal()->set_device(device));
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE, hal()->get_device_properties(device, &props));
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE, hal()->device_synchronize(device));
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE, hal()->mem_get_info(device, &free_bytes, &total_bytes));
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE, hal()->malloc(device, &ptr, 16));
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE, hal()->stream_create(device, 0, &stream));
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE, hal()->stream_get_default(device, &stream));
    EXPECT_GT(std::strlen(hal()->get_last_error_message()), 0u);
  }
  int current = -1;
  ASSERT_HAL_OK(hal()->get_device(&current));
  EXPECT_EQ(current, 0) << "a rejected set_device changed the current device";
}

TEST_P(HalErrors, FreeingUnknownOrFreedPointersIsRejected) {
  DeviceBuffer keep(hal(), 0, 1024);
  ASSERT_HAL_OK(keep.status());
  int on_stack = 0;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->free(&on_stack));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->free(keep.data() + 16));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->host_free(keep.data()));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->host_free(&on_stack));

  void* device_ptr = nullptr;
  ASSERT_HAL_OK(hal()->malloc(0, &device_ptr, 4096));
  ASSERT_HAL_OK(hal()->free(device_ptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->free(device_ptr));
  EXPECT_GT(std::strlen(hal()->get_last_error_message()), 0u);

  void* host_ptr = nullptr;
  ASSERT_HAL_OK(hal()->host_malloc(&host_ptr, 4096));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->free(host_ptr));
  ASSERT_HAL_OK(hal()->host_free(host_ptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->host_free(host_ptr));

  // The live allocation is untouched by the failed frees.
  std::vector<unsigned char> bytes(1024, 9);
  EXPECT_HAL_OK(hal()->memcpy(keep.data(), bytes.data(), bytes.size(), FLAGOS_MEMCPY_HOST_TO_DEVICE));
}

TEST_P(HalErrors, NullOutParametersAreInvalidValues) {
  OwnedStream stream(hal(), 0);
  OwnedEvent event(hal());
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(event.status());
  int value = 0;
  size_t bytes = 0;
  const flagos_status_t kInvalid = FLAGOS_ERROR_INVALID_VALUE;
  EXPECT_HAL_STATUS(kInvalid, hal()->get_device_count(nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->get_device(nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->get_device_properties(0, nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->mem_get_info(0, nullptr, &bytes));
  EXPECT_HAL_STATUS(kInvalid, hal()->mem_get_info(0, &bytes, nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->malloc(0, nullptr, 16));
  EXPECT_HAL_STATUS(kInvalid, hal()->host_malloc(nullptr, 16));
  EXPECT_HAL_STATUS(kInvalid, hal()->pointer_get_attributes(&value, nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->stream_get_priority_range(nullptr, &value));
  EXPECT_HAL_STATUS(kInvalid, hal()->stream_get_priority_range(&value, nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->stream_create(0, 0, nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->stream_get_default(0, nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->stream_get_device(stream.get(), nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->stream_get_native_handle(stream.get(), nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->launch_host_func(stream.get(), nullptr, nullptr));
  EXPECT_HAL_STATUS(kInvalid, hal()->event_create(nullptr, FLAGOS_EVENT_DEFAULT));
  EXPECT_HAL_STATUS(kInvalid, hal()->event_elapsed_time(nullptr, event.get(), event.get()));
  flagos_event_t unused = nullptr;
  EXPECT_HAL_STATUS(kInvalid, hal()->event_create(&unused, 0x100u));
}

TEST_P(HalErrors, DestroyedOrForeignHandlesAreInvalidHandles) {
  flagos_stream_t stream = nullptr;
  flagos_event_t event = nullptr;
  OwnedStream live_stream(hal(), 0);
  OwnedEvent live_event(hal());
  ASSERT_HAL_OK(live_stream.status());
  ASSERT_HAL_OK(live_event.status());
  ASSERT_HAL_OK(hal()->stream_create(0, 0, &stream));
  ASSERT_HAL_OK(hal()->event_create(&event, FLAGOS_EVENT_DEFAULT));
  ASSERT_HAL_OK(hal()->stream_destroy(stream));
  ASSERT_HAL_OK(hal()->event_destroy(event));

  auto garbage_stream = reinterpret_cast<flagos_stream_t>(uintptr_t{0x12345});
  auto event_as_stream = reinterpret_cast<flagos_stream_t>(live_event.get());
  auto stream_as_event = reinterpret_cast<flagos_event_t>(live_stream.get());
  const flagos_status_t kInvalid = FLAGOS_ERROR_INVALID_HANDLE;
  int device = 0;
  void* native = nullptr;
  std::atomic<int> flag{0};
  for (flagos_stream_t bad : {stream, garbage_stream, event_as_stream}) {
    EXPECT_HAL_STATUS(kInvalid, hal()->stream_query(bad));
    EXPECT_HAL_STATUS(kInvalid, hal()->stream_synchronize(bad));
    EXPECT_HAL_STATUS(kInvalid, hal()->stream_get_device(bad, &device));
    EXPECT_HAL_STATUS(kInvalid, hal()->stream_get_native_handle(bad, &native));
    EXPECT_HAL_STATUS(kInvalid, hal()->launch_host_func(bad, set_flag, &flag));
    EXPECT_HAL_STATUS(kInvalid, hal()->stream_wait_event(bad, live_event.get()));
    EXPECT_HAL_STATUS(kInvalid, hal()->event_record(live_event.get(), bad));
    EXPECT_HAL_STATUS(kInvalid, hal()->memset_async(nullptr, 0, 0, bad));
    EXPECT_HAL_STATUS(kInvalid, hal()->stream_destroy(bad));
  }
  float ms = 0;
  for (flagos_event_t bad : {event, stream_as_event}) {
    EXPECT_HAL_STATUS(kInvalid, hal()->event_query(bad));
    EXPECT_HAL_STATUS(kInvalid, hal()->event_synchronize(bad));
    EXPECT_HAL_STATUS(kInvalid, hal()->event_record(bad, live_stream.get()));
    EXPECT_HAL_STATUS(kInvalid, hal()->stream_wait_event(live_stream.get(), bad));
    EXPECT_HAL_STATUS(kInvalid, hal()->event_elapsed_time(&ms, bad, live_event.get()));
    EXPECT_HAL_STATUS(kInvalid, hal()->event_destroy(bad));
  }
  EXPECT_EQ(flag.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllHals, HalStreamsEvents, ::testing::ValuesIn(built_hals()), hal_param_name);
INSTANTIATE_TEST_SUITE_P(AllHals, HalErrors, ::testing::ValuesIn(built_hals()), hal_param_name);

}  // namespace
}  // namespace flagos::hal::testing
