#include "zero3/train/preemption.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <ctime>
#include <system_error>

#include "zero3/comm/typed_collectives.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"

namespace zero3::train {
namespace {

// Lock-free atomics only: the handler may run on any thread, between any two instructions.
std::atomic<int> g_reason{0};
std::atomic<std::int64_t> g_first_request_ns{0};
std::atomic<std::int64_t> g_repeat_window_ns{0};
std::atomic<bool> g_installed{false};
std::atomic<int> g_rank{-1};  // for the handler's notice
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free);

std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe (POSIX)
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

const char* signal_name(int sig) noexcept {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return nullptr;
  }
}

// "zero3 rank R: <signal><what>\n" in one write(), so the lines of ranks sharing a terminal do not
// interleave. No formatting library here: only what is async-signal-safe.
void write_notice(const char* signal, const char* what) noexcept {
  char rank[16] = "";
  if (int r = g_rank.load(); r >= 0) {
    char digits[12];
    int d = 0;
    do {
      digits[d++] = static_cast<char>('0' + r % 10);
      r /= 10;
    } while (r > 0 && d < 11);
    int n = 0;
    rank[n++] = ' ';
    for (const char* c = "rank "; *c != '\0'; ++c) rank[n++] = *c;
    while (d > 0) rank[n++] = digits[--d];
    rank[n] = '\0';
  }
  char line[256];
  std::size_t n = 0;
  for (const char* part : {"zero3", static_cast<const char*>(rank), ": ", signal, what, "\n"}) {
    for (const char* c = part; *c != '\0' && n < sizeof line; ++c) line[n++] = *c;
  }
  (void)::write(STDERR_FILENO, line, n);
}

// Only atomics, clock_gettime, write and _exit: all async-signal-safe.
extern "C" void on_stop_signal(int sig) {
  const int saved_errno = errno;
  const std::int64_t now = monotonic_ns();
  int none = 0;
  const char* name = signal_name(sig);
  if (g_reason.compare_exchange_strong(none, sig)) {
    g_first_request_ns.store(now);
    write_notice(name != nullptr ? name : "stop signal",
                 " received: stopping after this optimizer step (a second signal ends the process at once)");
  } else if (now - g_first_request_ns.load() > g_repeat_window_ns.load()) {
    write_notice(name != nullptr ? name : "stop signal", " received again: exiting at once, without a checkpoint");
    ::_exit(128 + sig);
  }
  errno = saved_errno;
}

}  // namespace

void request_stop(int reason) noexcept {
  int none = 0;
  if (g_reason.compare_exchange_strong(none, reason)) g_first_request_ns.store(monotonic_ns());
}

int stop_requested() noexcept {
  return g_reason.load();
}

void clear_stop_request() noexcept {
  g_reason.store(0);
}

std::string stop_reason_name(int reason) {
  if (reason == kStopRequestedByCall) return "a stop request";
  if (const char* name = signal_name(reason)) return name;
  return fmt::format("signal {}", reason);
}

struct StopSignals::Saved {
  int signal = 0;
  struct sigaction previous {};
};

StopSignals::StopSignals(const StopSignalOptions& options) {
  if (g_installed.exchange(true)) throw UsageError("StopSignals: the stop handlers are installed already");
  g_rank.store(options.rank);
  g_repeat_window_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(options.repeat_window).count());
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (const int sig : options.signals) {
    Saved s;
    s.signal = sig;
    if (::sigaction(sig, &action, &s.previous) != 0) {
      const std::string why = std::generic_category().message(errno);
      for (const Saved& done : saved_) ::sigaction(done.signal, &done.previous, nullptr);
      saved_.clear();
      g_installed.store(false);
      throw UsageError(fmt::format("StopSignals: cannot install a handler for signal {}: {}", sig, why));
    }
    saved_.push_back(s);
  }
}

StopSignals::~StopSignals() {
  if (kept_until_exit_) return;
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) ::sigaction(it->signal, &it->previous, nullptr);
  g_installed.store(false);
}

void StopSignals::keep_until_exit() noexcept {
  kept_until_exit_ = true;
}

StopAgreement agree_on_stop(comm::Bootstrap& bootstrap) {
  const std::vector<std::int32_t> all = comm::all_gather_values<std::int32_t>(bootstrap, stop_requested());
  StopAgreement a;
  for (int r = 0; r < bootstrap.size(); ++r) {
    const std::int32_t theirs = all[static_cast<std::size_t>(r)];
    if (theirs == 0) continue;
    if (!a.stop) a.reason = theirs;
    a.stop = true;
    a.ranks_asked.push_back(r);
  }
  return a;
}

void emit_stop_agreed(const StopAgreement& agreement, std::int64_t step, int rank) {
  if (rank != 0) return;
  events::emit(
      {.level = log::Level::warning,
       .kind = "preempt_requested",
       .step = step,
       .message = fmt::format("{} reached rank(s) {}: every rank stops after step {} and saves",
                              stop_reason_name(agreement.reason), fmt::join(agreement.ranks_asked, ", "), step),
       .figures = {{"signal", static_cast<double>(agreement.reason)}},
       .fields = {{"reason", stop_reason_name(agreement.reason)},
                  {"ranks", fmt::format("{}", fmt::join(agreement.ranks_asked, ","))}}});
}

void emit_preemption_outcome(const Preemption& p, int rank) {
  if (rank != 0) return;
  if (p.checkpoint) {
    events::emit({.level = log::Level::warning,
                  .kind = "preempt_checkpoint",
                  .step = p.step,
                  .message = fmt::format("stopped on {} after step {}: checkpoint {} written in {:.2f} s; resume "
                                         "with --resume latest",
                                         stop_reason_name(p.reason), p.step, p.checkpoint->string(), p.save_s),
                  .figures = {{"save_s", p.save_s}},
                  .fields = {{"reason", stop_reason_name(p.reason)}, {"path", p.checkpoint->string()}}});
  } else {
    events::emit({.level = log::Level::warning,
                  .kind = "preempt_nothing_saved",
                  .step = p.step,
                  .message = fmt::format("stopped on {} after step {}: nothing saved (no --save-dir); the run's "
                                         "steps are lost",
                                         stop_reason_name(p.reason), p.step),
                  .fields = {{"reason", stop_reason_name(p.reason)}}});
  }
}

}  // namespace zero3::train
