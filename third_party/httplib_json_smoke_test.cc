// cpp-httplib and nlohmann-json link and run: a JSON POST to a server on a loopback port.
#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace {

TEST(HttplibJsonSmoke, JsonEchoOverLoopback) {
  httplib::Server server;
  server.Post("/sum", [](const httplib::Request& req, httplib::Response& res) {
    nlohmann::json body = nlohmann::json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.contains("values")) {
      res.status = 400;
      res.set_content(R"({"error":"bad json"})", "application/json");
      return;
    }
    int sum = 0;
    for (const auto& v : body["values"]) sum += v.get<int>();
    res.set_content(nlohmann::json{{"sum", sum}}.dump(), "application/json");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread thread([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  httplib::Client client("127.0.0.1", port);
  auto ok = client.Post("/sum", R"({"values":[1,2,39]})", "application/json");
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(nlohmann::json::parse(ok->body).at("sum").get<int>(), 42);

  auto bad = client.Post("/sum", "{not json", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);

  server.stop();
  thread.join();
}

}  // namespace
