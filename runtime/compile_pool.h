// The background compiles of Options::async_compile: a process-wide pool of a few worker threads
// (Note [Compile pool]).
//
// Note [Compile pool]
// Every async compile used to get a thread of its own (8 MB of stack reserved, kept until the
// function was destroyed). Now jobs go to one queue served by kWorkers threads, started on first
// use and alive until exit. Each CompiledFunction owns a Group; destroying the function cancels
// the group's queued jobs (their entries die with the function) and waits for its running ones,
// so no job outlives what it captured. Compiles are child processes of a few hundred ms each; more
// workers than cores would only make them slower.
#ifndef WARDEN_RUNTIME_COMPILE_POOL_H_
#define WARDEN_RUNTIME_COMPILE_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace warden::runtime {

class CompilePool {
 public:
  static constexpr int kWorkers = 2;

  // The jobs of one owner (a compiled function).
  class Group {
   public:
    Group() = default;

   private:
    friend class CompilePool;
    std::mutex mu_;
    std::condition_variable idle_;
    int running_ = 0;
    bool cancelled_ = false;
  };

  static CompilePool& Get();  // never destroyed

  // Queues `job` for `group`; it runs on a worker unless the group is cancelled first. A job must
  // not throw (exceptions are caught and dropped).
  void Submit(const std::shared_ptr<Group>& group, std::function<void()> job);

  // Drops the group's queued jobs and waits until none of its jobs is running. Later Submits to
  // the group are dropped.
  void Cancel(const std::shared_ptr<Group>& group);

  // Worker threads started so far (at most kWorkers), for tests.
  int workers() const;

 private:
  CompilePool() = default;
  void Work();

  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::pair<std::shared_ptr<Group>, std::function<void()>>> queue_;
  int workers_ = 0;
  int idle_workers_ = 0;
};

}  // namespace warden::runtime

#endif  // WARDEN_RUNTIME_COMPILE_POOL_H_
