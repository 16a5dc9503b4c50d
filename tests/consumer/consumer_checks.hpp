// The consumer's checks: each names what it checked; main() exits non-zero when any failed.
#pragma once

#include <memory>
#include <string>

#include "zero3/comm/communicator.hpp"

namespace consumer {

void expect(bool ok, const std::string& what);
// zero3::train::Trainer over a model and data of the consumer's own (train_bigram.cpp). MPI is
// initialized once per process: the caller keeps `bootstrap` alive across every engine it makes.
void check_train_loop(const std::shared_ptr<zero3::comm::Bootstrap>& bootstrap);

}  // namespace consumer
