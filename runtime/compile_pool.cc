// Note [Compile pool] in compile_pool.h.
#include "runtime/compile_pool.h"

#include <algorithm>
#include <system_error>

namespace warden::runtime {

CompilePool& CompilePool::Get() {
  static CompilePool* pool = new CompilePool();
  return *pool;
}

void CompilePool::Submit(const std::shared_ptr<Group>& group, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> g(group->mu_);
    if (group->cancelled_) return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  queue_.emplace_back(group, std::move(job));
  // A worker per queued job, up to kWorkers: jobs submitted together run together.
  if (queue_.size() > static_cast<size_t>(idle_workers_) && workers_ < kWorkers) {
    try {
      std::thread([this] { Work(); }).detach();
      ++workers_;
    } catch (const std::system_error&) {
      // No thread now: an existing worker, or the next Submit, takes the job.
    }
  }
  ready_.notify_one();
}

void CompilePool::Cancel(const std::shared_ptr<Group>& group) {
  {
    std::lock_guard<std::mutex> g(group->mu_);
    group->cancelled_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [&](const auto& j) { return j.first == group; }),
                 queue_.end());
  }
  std::unique_lock<std::mutex> g(group->mu_);
  group->idle_.wait(g, [&] { return group->running_ == 0; });
}

int CompilePool::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_;
}

void CompilePool::Work() {
  for (;;) {
    std::shared_ptr<Group> group;
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++idle_workers_;
      ready_.wait(lock, [&] { return !queue_.empty(); });
      --idle_workers_;
      group = std::move(queue_.front().first);
      job = std::move(queue_.front().second);
      queue_.pop_front();
    }
    {
      std::lock_guard<std::mutex> g(group->mu_);
      if (group->cancelled_) continue;
      ++group->running_;
    }
    try {
      job();
    } catch (...) {
    }
    job = nullptr;  // what the job captured goes before the group counts it done
    {
      std::lock_guard<std::mutex> g(group->mu_);
      --group->running_;
    }
    group->idle_.notify_all();
  }
}

}  // namespace warden::runtime
