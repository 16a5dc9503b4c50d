#include "zero3/core/events.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "zero3/core/json_text.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX declares it nowhere in a header

namespace zero3::events {
namespace {

std::mutex g_mutex;
Options g_options;             // guarded by g_mutex
std::vector<pid_t> g_running;  // alert commands not yet reaped; guarded by g_mutex

std::string_view level_name(log::Level l) {
  switch (l) {
    case log::Level::debug:
      return "debug";
    case log::Level::info:
      return "info";
    case log::Level::warning:
      return "warning";
    case log::Level::error:
      return "error";
  }
  return "info";
}

// Every string of an event is JSON-safe: a message quoting a file name that is not UTF-8 still makes a line
// that is JSON (zero3/core/json_text.hpp).
void append_escaped(std::string& out, std::string_view s) {
  out += json_quoted(s);
}

// JSON has no NaN or infinity: those figures are written as the strings "nan", "inf", "-inf".
void append_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "\"nan\"";
  } else if (std::isinf(v)) {
    out += v > 0 ? "\"inf\"" : "\"-inf\"";
  } else {
    out += fmt::format("{}", v);
  }
}

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

std::string json_line(const Event& e, int rank) {
  std::string out = "{\"time\": ";
  append_escaped(out, utc_now());
  out += ", \"level\": ";
  append_escaped(out, level_name(e.level));
  out += fmt::format(", \"rank\": {}, \"step\": {}, \"kind\": ", rank, e.step);
  append_escaped(out, e.kind);
  out += ", \"message\": ";
  append_escaped(out, e.message);
  out += ", \"figures\": {";
  for (std::size_t i = 0; i < e.figures.size(); ++i) {
    if (i > 0) out += ", ";
    append_escaped(out, e.figures[i].first);
    out += ": ";
    append_number(out, e.figures[i].second);
  }
  out += "}, \"fields\": {";
  for (std::size_t i = 0; i < e.fields.size(); ++i) {
    if (i > 0) out += ", ";
    append_escaped(out, e.fields[i].first);
    out += ": ";
    append_escaped(out, e.fields[i].second);
  }
  out += "}}";
  return out;
}

// Appends one line with one write(): lines of ranks sharing the file never interleave.
void append_line(const std::filesystem::path& dir, const std::string& line) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    log::warn("events: cannot create the run directory {}: {}", dir.string(), ec.message());
    return;
  }
  const std::filesystem::path file = dir / "events.jsonl";
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    log::warn("events: cannot open {}: {}", file.string(), std::strerror(errno));
    return;
  }
  const std::string text = line + "\n";
  const ssize_t n = ::write(fd, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) log::warn("events: short write to {}", file.string());
  ::close(fd);
}

void reap_finished() {  // requires g_mutex
  std::erase_if(g_running, [](pid_t pid) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      log::warn("events: the alert command exited with status {}", WEXITSTATUS(status));
    }
    return r != 0;  // done (or not ours any more)
  });
}

// Starts `/bin/sh -c command` with `line` on its stdin. posix_spawn, not fork: safe in a process whose
// MPI library registers fork handlers or holds pinned memory.
void start_alert(const std::string& command, const std::string& line) {  // requires g_mutex
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    log::warn("events: alert command not run: pipe: {}", std::strerror(errno));
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): posix_spawn's historical signature
  const int rc = ::posix_spawn(&pid, "/bin/sh", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    log::warn("events: alert command '{}' not started: {}", command, std::strerror(rc));
    return;
  }
  const std::string text = line + "\n";
  // A command that does not read its stdin must not block us, nor kill us with SIGPIPE.
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t old_set;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  (void)::write(fds[1], text.data(), text.size());
  ::close(fds[1]);
  const timespec none{0, 0};
  (void)sigtimedwait(&pipe_set, nullptr, &none);  // drop a SIGPIPE raised by our write
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  g_running.push_back(pid);
}

}  // namespace

void configure(Options options) {
  std::lock_guard lock(g_mutex);
  g_options = std::move(options);
}

std::filesystem::path run_dir() {
  std::lock_guard lock(g_mutex);
  return g_options.run_dir;
}

std::string to_json_line(const Event& event) {
  std::lock_guard lock(g_mutex);
  return json_line(event, g_options.rank);
}

void emit(const Event& event) {
  try {
    log::write(event.level, event.message);
    std::lock_guard lock(g_mutex);
    reap_finished();
    const std::string line = json_line(event, g_options.rank);
    if (!g_options.run_dir.empty()) append_line(g_options.run_dir, line);
    if (!g_options.alert_command.empty() && event.level >= g_options.alert_level) {
      start_alert(g_options.alert_command, line);
    }
  } catch (const std::exception& e) {
    log::warn("events: event '{}' not recorded: {}", event.kind, e.what());
  }
}

bool flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard lock(g_mutex);
      reap_finished();
      if (g_running.empty()) return true;
      if (std::chrono::steady_clock::now() >= deadline) {
        log::warn("events: {} alert command(s) still running after {} ms", g_running.size(), timeout.count());
        return false;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace zero3::events
