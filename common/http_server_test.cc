#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace sluice::http {
namespace {

// A raw client socket, for clients that misbehave.
class RawSocket {
 public:
  explicit RawSocket(int port, int rcvbuf = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawSocket() { Close(); }
  bool connected() const { return connected_; }
  bool Send(const std::string& s) { return send(fd_, s.data(), s.size(), MSG_NOSIGNAL) >= 0; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Reads until the server closes the connection or `ms` pass; true when it closed.
  bool ClosedWithin(int ms, std::string* got = nullptr) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    char buf[4096];
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
      if (got != nullptr) got->append(buf, static_cast<size_t>(n));
    }
    return false;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// httplib's client writes without MSG_NOSIGNAL: a body the server stopped reading (413) must
// not kill the test.
const bool kNoSigpipe = [] {
  signal(SIGPIPE, SIG_IGN);
  return true;
}();

Handler Text(std::string body) {
  return [body](Request, std::shared_ptr<Responder> r) { r->Send(200, "text/plain", body); };
}

TEST(HttpServerTest, AnswersRoutesAndSaysWhatIsMissing) {
  auto server = Server::Start(
      {}, {{"GET /health", Text("ok")},
           {"POST /echo", [](Request q, std::shared_ptr<Responder> r) {
              r->Send(201, "text/plain", q.body + q.Header("X-Tag"), {{"X-Seen", q.method}});
            }}});
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client c("127.0.0.1", (*server)->port());
  for (int i = 0; i < 3; ++i) {  // one kept-alive connection
    auto res = c.Get("/health?probe=1");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, "ok");
  }
  auto echoed = c.Post("/echo", {{"x-tag", "!"}}, "hello", "text/plain");
  ASSERT_TRUE(echoed);
  EXPECT_EQ(echoed->status, 201);
  EXPECT_EQ(echoed->body, "hello!");
  EXPECT_EQ(echoed->get_header_value("X-Seen"), "POST");
  auto missing = c.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto wrong = c.Get("/echo");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
}

TEST(HttpServerTest, StreamsChunksWrittenFromAnotherThread) {
  std::vector<std::thread> workers;
  auto server =
      Server::Start({}, {{"GET /stream", [&workers](Request, std::shared_ptr<Responder> r) {
                            workers.emplace_back([r] {
                              r->Begin(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
                              for (int i = 0; i < 5; ++i) {
                                r->Write(absl::StrCat("data: ", i, "\n\n"));
                                std::this_thread::sleep_for(std::chrono::milliseconds(5));
                              }
                              r->End();
                            });
                          }}});
  ASSERT_TRUE(server.ok());
  httplib::Client c("127.0.0.1", (*server)->port());
  std::string got;
  int pieces = 0;
  auto res = c.Get("/stream", [&](const char* data, size_t n) {
    got.append(data, n);
    ++pieces;
    return true;
  });
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Transfer-Encoding"), "chunked");
  EXPECT_EQ(got, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  EXPECT_GT(pieces, 1);
  for (auto& t : workers) t.join();
}

TEST(HttpServerTest, SlowSocketsHoldNoOneElsesAnswer) {
  auto server = Server::Start({}, {{"GET /health", Text("ok")}});
  ASSERT_TRUE(server.ok());
  std::vector<std::unique_ptr<RawSocket>> slow;
  for (int i = 0; i < 300; ++i) {
    slow.push_back(std::make_unique<RawSocket>((*server)->port()));
    ASSERT_TRUE(slow.back()->connected());
    // A third send nothing, a third half a request line, a third headers without their end.
    if (i % 3 == 1) slow.back()->Send("GET /hea");
    if (i % 3 == 2) slow.back()->Send("POST /health HTTP/1.1\r\nHost: x\r\n");
  }
  httplib::Client c("127.0.0.1", (*server)->port());
  c.set_read_timeout(2, 0);
  auto res = c.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "ok");
  EXPECT_GE((*server)->connections(), 300);
}

TEST(HttpServerTest, ARequestMustArriveWithinItsDeadline) {
  auto server =
      Server::Start({.read_deadline = absl::Milliseconds(300)}, {{"POST /echo", Text("never")}});
  ASSERT_TRUE(server.ok());
  RawSocket s((*server)->port());
  ASSERT_TRUE(s.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"));
  // One byte every 50 ms would take 5 s: the connection closes at the deadline, each byte
  // notwithstanding.
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {
    s.Send("x");
    closed = s.ClosedWithin(50);
  }
  EXPECT_TRUE(closed);
}

TEST(HttpServerTest, AnIdleConnectionCloses) {
  auto server = Server::Start({.idle_timeout = absl::Milliseconds(200)}, {});
  ASSERT_TRUE(server.ok());
  RawSocket s((*server)->port());
  EXPECT_TRUE(s.ClosedWithin(3000));
}

TEST(HttpServerTest, OversizedBodiesAndHeadersGetTheirStatus) {
  auto server = Server::Start(
      {.max_body_bytes = 1024,
       .max_header_bytes = 2048,
       .error_body = [](int status, const std::string& m) -> std::pair<std::string, std::string> {
         return {"application/json", absl::StrCat("{\"status\":", status, ",\"m\":\"", m, "\"}")};
       }},
      {{"POST /echo", Text("fine")}});
  ASSERT_TRUE(server.ok());
  httplib::Client c("127.0.0.1", (*server)->port());
  auto ok = c.Post("/echo", std::string(1000, 'a'), "text/plain");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto big = c.Post("/echo", std::string(5000, 'a'), "text/plain");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_NE(big->body.find("larger than 1024 bytes"), std::string::npos) << big->body;
  httplib::Client c2("127.0.0.1", (*server)->port());
  auto headers = c2.Post("/echo", {{"X-Big", std::string(4000, 'h')}}, "x", "text/plain");
  ASSERT_TRUE(headers);
  EXPECT_EQ(headers->status, 431);

  RawSocket raw((*server)->port());
  raw.Send("NOT HTTP AT ALL\r\n\r\n");
  std::string got;
  EXPECT_TRUE(raw.ClosedWithin(3000, &got));
  EXPECT_NE(got.find("400"), std::string::npos) << got;
}

TEST(HttpServerTest, AClientThatGoesAwayIsHeardAtOnce) {
  std::promise<std::shared_ptr<Responder>> held;
  std::promise<void> heard;
  auto server = Server::Start({}, {{"POST /wait", [&](Request, std::shared_ptr<Responder> r) {
                                      r->OnGone([&] { heard.set_value(); });
                                      held.set_value(r);
                                    }}});
  ASSERT_TRUE(server.ok());
  {
    RawSocket s((*server)->port());
    s.Send("POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    auto f = held.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    std::shared_ptr<Responder> r = f.get();
    EXPECT_FALSE(r->gone());
    s.Close();
    ASSERT_EQ(heard.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_TRUE(r->gone());
    r->Begin(200, "text/plain");  // into nothing, harmlessly
    r->Write("late");
    r->End();
  }
  for (int i = 0; i < 100 && (*server)->connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*server)->connections(), 0);
}

TEST(HttpServerTest, AClientThatReadsNothingIsDropped) {
  std::promise<std::shared_ptr<Responder>> held;
  auto server = Server::Start(
      {.max_unsent_bytes = 64 << 10},
      {{"GET /flood", [&](Request, std::shared_ptr<Responder> r) { held.set_value(r); }}});
  ASSERT_TRUE(server.ok());
  RawSocket s((*server)->port(), /*rcvbuf=*/4096);
  s.Send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<Responder> r = held.get_future().get();
  r->Begin(200, "text/plain");
  const std::string piece(16 << 10, 'z');
  for (int i = 0; i < 4096 && !r->gone(); ++i) {  // up to 64 MiB
    r->Write(piece);
    if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int i = 0; i < 200 && !r->gone(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(r->gone());
  r->End();
}

TEST(HttpServerTest, AResponderOutlivesItsServer) {
  std::promise<std::shared_ptr<Responder>> held;
  auto server = Server::Start(
      {}, {{"GET /later", [&](Request, std::shared_ptr<Responder> r) { held.set_value(r); }}});
  ASSERT_TRUE(server.ok());
  RawSocket s((*server)->port());
  s.Send("GET /later HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<Responder> r = held.get_future().get();
  server->reset();
  r->Send(200, "text/plain", "too late");
  r->End();
  EXPECT_TRUE(s.ClosedWithin(3000));
}

TEST(HttpServerTest, APortInUseIsAnError) {
  auto first = Server::Start({}, {});
  ASSERT_TRUE(first.ok());
  auto second = Server::Start({.port = (*first)->port()}, {});
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("cannot listen"), std::string::npos);
}

}  // namespace
}  // namespace sluice::http
