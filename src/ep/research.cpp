#include "ubep/research.hpp"

#include "core/enum_names.hpp"

namespace ubep {

namespace {
constexpr detail::EnumName<SyncMode> kSyncModes[] = {{SyncMode::kFused, "fused"},
                                                     {SyncMode::kStopAndWait, "stop-and-wait"}};
constexpr detail::EnumName<SendSchedule> kSchedules[] = {
    {SendSchedule::kEqualSlices, "equal"},
    {SendSchedule::kNaive, "naive"},
    {SendSchedule::kColumnMajor, "column_major"},
    {SendSchedule::kBalanced, "balanced"}};
}  // namespace

const char* sync_mode_name(SyncMode m) { return detail::enum_name(kSyncModes, m); }
SyncMode parse_sync_mode(const std::string& n) {
  return detail::parse_enum(kSyncModes, n, "sync mode");
}
const char* send_schedule_name(SendSchedule s) { return detail::enum_name(kSchedules, s); }
SendSchedule parse_send_schedule(const std::string& n) {
  return detail::parse_enum(kSchedules, n, "send schedule");
}

}  // namespace ubep
