// One iteration of a PipelineNode (pipeline.h), as an object: what the iteration shares between its
// threads and what its compute keeps are members, the work a message calls for is a method each
// (a forward, the head at the origin, a backward), and the two orders of work are two strategies:
// the timetable's (each piece of work when its turn comes, deterministic) and arrival order under
// the memory bound. Internal to src/train.
//
// Threading: run() on the iteration's thread; it starts a receiving thread per link with something
// to come and a sending thread per link with something to go, all on the node's Clock, and joins them
// before it returns (or, failing, in the destructor, after closing every link so the others learn).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/signal.h"
#include "core/status.h"
#include "train/pipeline.h"
#include "train/pipeline_wire.h"

namespace gossamer::train::pipeline_detail {

struct Route {
  int agent = 0;
  std::vector<int> path;  // origin, then the hops
};

// Every micro-batch's path, in the schedule's order (agents in order, each one's in turn).
std::vector<Route> routes(const skippipe::Schedule& s);

// The sender and receiver of a micro-batch's message at `hop` in each direction.
std::pair<int, int> ends(const Route& r, bool backward, int hop);

class PipelineIteration {
 public:
  PipelineIteration(PipelineNode& node, std::uint64_t iteration, const std::vector<MicroBatchData>& data, Deadline deadline);
  PipelineIteration(const PipelineIteration&) = delete;
  PipelineIteration& operator=(const PipelineIteration&) = delete;
  // A run that did not finish closes every link first (the others learn at once), then joins.
  ~PipelineIteration();

  [[nodiscard]] Result<IterationStats> run();

 private:
  using Decoded = std::pair<ActivationHeader, at::Tensor>;
  struct Inbound {
    int from;
    Bytes bytes;
  };
  struct Held {
    at::Tensor in;   // the activations that came in (a leaf whose gradient goes back), undefined at the origin
    at::Tensor out;  // this stage's output, with its graph
  };

  void count_messages();
  void start_threads();
  void receive_from(std::size_t j);
  void send_to(std::size_t j);
  void fail(Status st);  // with mu_ held
  double since() const;

  // The strategies: the timetable's order, or arrival order under the memory bound.
  [[nodiscard]] Status in_timetable_order();
  [[nodiscard]] Status in_arrival_order();

  [[nodiscard]] Status send(int to, ActivationHeader h, const at::Tensor& x);
  void charge(std::uint32_t mb, WorkKind kind, double start);
  at::Tensor run_blocks(at::Tensor x);
  [[nodiscard]] Status check(int from, const ActivationHeader& h) const;
  [[nodiscard]] Status compute(const ActivationHeader& h, at::Tensor x);
  [[nodiscard]] Status forward(const ActivationHeader& h, at::Tensor x);
  [[nodiscard]] Status head(const ActivationHeader& h, at::Tensor x);
  [[nodiscard]] Status backward(const ActivationHeader& h, const at::Tensor& x);
  [[nodiscard]] Status process(int from, const ActivationHeader& h, at::Tensor x);
  [[nodiscard]] Status launch(std::size_t k);
  [[nodiscard]] Result<std::pair<int, Decoded>> receive();
  [[nodiscard]] Status drain();

  PipelineNode& node_;
  const std::uint64_t iteration_;
  const std::vector<MicroBatchData>& data_;
  const Deadline deadline_;
  const std::vector<Route> all_;
  const int memory_;
  const transport::Tag tag_;
  const ActivationLimits limits_;
  Clock& clock_;
  const Nanos t0_;
  std::vector<std::uint32_t> own_;      // what this node launches
  std::vector<int> expected_;           // messages each other node sends this one
  std::vector<int> outgoing_;           // and this one sends each
  int total_expected_ = 0;

  // Shared with the threads, under mu_.
  std::mutex mu_;
  std::unique_ptr<Signal> signal_;
  std::deque<Inbound> inbox_;
  std::vector<std::deque<Bytes>> outbox_;
  bool stopping_ = false;
  Status failed_;
  std::vector<std::unique_ptr<ClockThread>> threads_;
  bool finished_ok_ = false;

  // The compute's, on the iteration's thread.
  IterationStats stats_;
  std::map<std::uint32_t, Held> held_;  // hop nodes: activations held; origins: their micro-batches in flight
  std::map<std::uint32_t, double> loss_of_;
  std::size_t launched_ = 0, finished_ = 0;
  int processed_ = 0;
  std::vector<std::pair<int, Decoded>> waiting_;  // decoded forwards waiting for memory
};

}  // namespace gossamer::train::pipeline_detail
