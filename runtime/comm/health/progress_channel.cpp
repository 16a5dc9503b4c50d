// make_progress_channel: the watchdog's out-of-band channel over the progress store (progress_store.hpp):
// a ProgressServer on rank 0, its endpoint and secret broadcast through the bootstrap, and one
// ProgressClient per rank. The client is used from one thread at a time (a mutex here), since the
// watchdog thread and a failing trainer thread may both report.
#include <fmt/format.h>

#include <exception>
#include <mutex>

#include "progress_store.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::comm {

namespace {

// Long enough for a loaded rank 0 to answer, short enough that a report naming rank 0 as the missing
// one comes within a few seconds of the deadline.
constexpr std::chrono::milliseconds kStoreTimeout{2000};

class StoreChannel final : public ProgressChannel {
 public:
  StoreChannel(std::unique_ptr<ProgressServer> server, const ProgressEndpoint& endpoint, int rank)
      : server_(std::move(server)), client_(endpoint, rank, kStoreTimeout) {
    if (!client_.connect()) log::warn("progress store: rank {} could not connect: {}", rank, client_.last_error());
  }

  void publish(const std::string& progress) override {
    std::lock_guard lock(mutex_);
    if (progress.size() > kMaxProgressRecordBytes) return;
    const bool ok = client_.publish(progress);
    if (!ok && !publish_failed_) log::warn("progress store: publishing failed: {}", client_.last_error());
    publish_failed_ = !ok;  // one line per outage, not one per tick
  }

  std::optional<std::vector<std::optional<Peer>>> fetch() override {
    std::lock_guard lock(mutex_);
    std::optional<ProgressSnapshot> snap = client_.fetch();
    if (!snap) return std::nullopt;
    if (snap->failure_notice) failure_ = snap->failure_notice;
    std::vector<std::optional<Peer>> peers(snap->ranks.size());
    for (std::size_t r = 0; r < snap->ranks.size(); ++r) {
      const RankProgress& p = snap->ranks[r];
      if (p.published) peers[r] = Peer{p.record, static_cast<double>(p.age_ms) / 1000.0};
    }
    return peers;
  }

  void post_failure(const std::string& notice) override {
    std::lock_guard lock(mutex_);
    client_.post_failure(notice.substr(0, kMaxFailureNoticeBytes));
  }

  std::optional<std::string> poll_failure() override {
    std::lock_guard lock(mutex_);
    if (failure_) return failure_;
    if (std::optional<ProgressSnapshot> snap = client_.fetch()) failure_ = snap->failure_notice;
    return failure_;
  }

 private:
  std::unique_ptr<ProgressServer> server_;  // rank 0 only; before the client, which talks to it
  std::mutex mutex_;
  ProgressClient client_;               // guarded by mutex_
  std::optional<std::string> failure_;  // guarded by mutex_
  bool publish_failed_ = false;         // guarded by mutex_
};

// Rank 0's server, or the reason it could not start. Every rank learns the outcome from rank 0 before the
// endpoint is shared: a port taken by another job (ZERO3_PROGRESS_PORT) or a bad address must end every
// rank with the same named error, not leave the others waiting for an endpoint that never comes.
std::unique_ptr<ProgressServer> start_server(Bootstrap& bootstrap, bool single_host) {
  std::unique_ptr<ProgressServer> server;
  std::exception_ptr failure;
  std::string why;
  bool config_error = false;
  if (bootstrap.rank() == 0) {
    try {
      ProgressServerOptions options;
      options.world_size = bootstrap.size();
      options.single_host = single_host;
      server = std::make_unique<ProgressServer>(std::move(options));
      const ProgressEndpoint& at = server->endpoint();
      log::info("progress store: listening on {}:{} ({} ranks)", at.host, at.port, bootstrap.size());
    } catch (const Error& e) {
      failure = std::current_exception();
      config_error = dynamic_cast<const ConfigError*>(&e) != nullptr;
      why = fmt::format("{}{}", config_error ? 'C' : 'M', e.what());
    }
  }
  why = broadcast_string(bootstrap, why, 0);
  if (failure) std::rethrow_exception(failure);
  if (!why.empty()) {
    const std::string message = fmt::format("the progress store of rank 0 did not start: {}", why.substr(1));
    if (why.front() == 'C') throw ConfigError(message);
    throw CommError(message);
  }
  return server;
}

}  // namespace

std::shared_ptr<ProgressChannel> make_progress_channel(Bootstrap& bootstrap, bool single_host) {
  if (bootstrap.size() <= 1) return nullptr;
  std::unique_ptr<ProgressServer> server = start_server(bootstrap, single_host);
  const ProgressEndpoint endpoint = share_progress_endpoint(bootstrap, server.get());
  return std::make_shared<StoreChannel>(std::move(server), endpoint, bootstrap.rank());
}

}  // namespace zero3::comm
