#include "common/elastic_pool.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

// Waits up to 5 s for `done`.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

TEST(ElasticPoolTest, GrowsToItsBoundAndQueuesThePast) {
  ElasticPool pool(4, absl::Seconds(60));
  absl::Notification release;
  std::atomic<int> running{0}, ran{0};
  for (int i = 0; i < 10; ++i) {
    pool.Post([&] {
      ++running;
      release.WaitForNotification();
      --running;
      ++ran;
    });
  }
  ASSERT_TRUE(Eventually([&] { return running.load() == 4; }));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(running.load(), 4);  // the other 6 wait, holding no thread
  EXPECT_EQ(pool.threads(), 4);
  release.Notify();
  ASSERT_TRUE(Eventually([&] { return ran.load() == 10; }));
  EXPECT_EQ(pool.started(), 4);
}

TEST(ElasticPoolTest, AnIdleThreadTakesTheNextTaskRatherThanANewOne) {
  ElasticPool pool(8, absl::Seconds(60));
  for (int i = 0; i < 20; ++i) {
    std::atomic<bool> done{false};
    pool.Post([&] { done = true; });
    ASSERT_TRUE(Eventually([&] { return done.load(); }));
  }
  EXPECT_EQ(pool.started(), 1);
}

TEST(ElasticPoolTest, IdleThreadsEndAfterKeepAliveAndComeBackWithWork) {
  ElasticPool pool(3, absl::Milliseconds(50));
  absl::Notification release;
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    pool.Post([&] {
      release.WaitForNotification();
      ++ran;
    });
  }
  ASSERT_TRUE(Eventually([&] { return pool.threads() == 3; }));
  release.Notify();
  ASSERT_TRUE(Eventually([&] { return ran.load() == 3; }));
  ASSERT_TRUE(Eventually([&] { return pool.threads() == 0; }));
  // The threads that ended joined one another: only the last one's stack waits for a task.
  EXPECT_EQ(pool.unjoined(), 1);
  std::atomic<bool> again{false};
  pool.Post([&] { again = true; });
  ASSERT_TRUE(Eventually([&] { return again.load(); }));
  EXPECT_EQ(pool.started(), 4);
}

TEST(ElasticPoolTest, JoinRunsEveryQueuedTaskThenEndsTheThreads) {
  std::atomic<int> ran{0};
  {
    ElasticPool pool(2, absl::Seconds(60));
    for (int i = 0; i < 50; ++i) {
      pool.Post([&] {
        absl::SleepFor(absl::Milliseconds(1));
        ++ran;
      });
    }
    pool.Join();
    EXPECT_EQ(ran.load(), 50);
    EXPECT_EQ(pool.threads(), 0);
    pool.Post([&] { ++ran; });  // after the join: on this thread
    EXPECT_EQ(ran.load(), 51);
  }
}

TEST(ElasticPoolTest, ManyPostersNeverLoseATask) {
  std::atomic<int> ran{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  ElasticPool pool(6, absl::Microseconds(200));  // threads end and start all through
  std::vector<std::thread> posters;
  for (int p = 0; p < 4; ++p) {
    posters.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        pool.Post([&] {
          {
            std::lock_guard<std::mutex> lock(mu);
            ids.insert(std::this_thread::get_id());
          }
          ++ran;
        });
        if (i % 50 == 0) absl::SleepFor(absl::Milliseconds(1));
      }
    });
  }
  for (std::thread& t : posters) t.join();
  ASSERT_TRUE(Eventually([&] { return ran.load() == 2000; }));
  pool.Join();
  EXPECT_EQ(ran.load(), 2000);
  EXPECT_LE(pool.threads(), 0);
  EXPECT_GE(pool.started(), 1);
}

}  // namespace
}  // namespace sluice
