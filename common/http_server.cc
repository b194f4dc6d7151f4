#include "common/http_server.h"

#include <sys/resource.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace sluice::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

std::chrono::steady_clock::duration Chrono(absl::Duration d) {
  return absl::ToChronoMicroseconds(d);
}

// Lets a Responder post to the I/O thread for as long as the server runs, and never after.
struct Gate {
  std::mutex mu;
  net::io_context* ioc = nullptr;  // null once the server stops

  template <typename F>
  void Post(F f) {
    std::lock_guard<std::mutex> lock(mu);
    if (ioc != nullptr) net::post(*ioc, std::move(f));
  }
};

// A socket holds many more than the default 1,024 descriptors' worth of clients: the soft limit
// goes up to the hard one, once per process.
void RaiseDescriptorLimit() {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
      r.rlim_cur = r.rlim_max;
      setrlimit(RLIMIT_NOFILE, &r);
    }
  });
}

}  // namespace

std::string Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, absl::string_view(name.data(), name.size()))) return v;
  }
  return "";
}

class Session;

class Server::Impl {
 public:
  explicit Impl(ServerOptions o, std::map<std::string, Handler> r)
      : options(std::move(o)), routes(std::move(r)), gate(std::make_shared<Gate>()) {
    gate->ioc = &ioc;
  }

  void Accept();
  std::pair<std::string, std::string> ErrorBody(int status, const std::string& message) const {
    if (options.error_body) return options.error_body(status, message);
    return {"text/plain; charset=utf-8", message + "\n"};
  }

  ServerOptions options;
  std::map<std::string, Handler> routes;
  std::atomic<int> open{0};  // before ioc: sessions its destruction frees count themselves out
  int port = 0;
  net::io_context ioc{1};
  net::executor_work_guard<net::io_context::executor_type> work = net::make_work_guard(ioc);
  tcp::acceptor acceptor{ioc};
  net::steady_timer backoff{ioc};
  std::shared_ptr<Gate> gate;
  std::vector<std::weak_ptr<Session>> sessions;  // the I/O thread's; pruned as it accepts
  bool stopping = false;
  std::thread thread;
};

namespace {

// One queued piece of a response, written in order.
struct Out {
  enum Kind { kWhole, kHead, kChunk, kLast } kind;
  std::shared_ptr<bhttp::response<bhttp::string_body>> whole;
  std::shared_ptr<bhttp::response<bhttp::empty_body>> head;
  std::string data;
};

}  // namespace

// One connection. Everything here runs on the I/O thread. It keeps itself alive (self_) while
// a handler holds the request it is answering; every pending operation holds it too.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server::Impl& server, tcp::socket socket) : srv_(server), stream_(std::move(socket)) {
    ++srv_.open;
  }
  ~Session() { --srv_.open; }

  void Start() { ReadIdle(); }

  // Calls from the request's Responder (seq names the request; a stale one does nothing).
  void Send(uint64_t seq, int status, std::string type, std::string body, Headers extra);
  void Begin(uint64_t seq, int status, std::string type, Headers extra);
  void Write(uint64_t seq, std::string data);
  void End(uint64_t seq);
  void OnGone(uint64_t seq, std::function<void()> f);

  // Drops the connection: the client has gone, broke a bound, or the server stops.
  void Close();

 private:
  void ReadIdle();
  void ReadRequest();
  void OnRequest(beast::error_code ec);
  void Dispatch(bhttp::request<bhttp::string_body> req);
  void Watch();
  void Enqueue(Out out);
  void WriteNext();
  void Finish();
  void Linger();
  template <typename Body>
  void Prepare(bhttp::response<Body>& res, int status, const std::string& type,
               const Headers& extra);

  Server::Impl& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  uint64_t seq_ = 0;
  bool handling_ = false;  // a request is being answered
  bool began_ = false;     // its response's head is queued
  bool ended_ = false;     // its response is whole in the queue
  bool keep_alive_ = false;
  bool closed_ = false;
  bool writing_ = false;
  bool watching_ = false;          // waiting for the socket to turn readable (EOF: gone)
  bool read_after_watch_ = false;  // the next request is read once the watch is cancelled
  bool lingering_ = false;         // closing: what the client sends is dropped (Linger)
  std::chrono::steady_clock::time_point linger_until_;
  std::shared_ptr<Session> self_;
  std::shared_ptr<std::atomic<bool>> gone_;
  std::function<void()> on_gone_;
  std::deque<Out> queue_;
  size_t unsent_ = 0;
  std::unique_ptr<bhttp::response_serializer<bhttp::empty_body>> head_writer_;
};

namespace {

class Reply : public Responder, public std::enable_shared_from_this<Reply> {
 public:
  Reply(std::shared_ptr<Gate> gate, std::weak_ptr<Session> session, uint64_t seq,
        std::shared_ptr<std::atomic<bool>> gone)
      : gate_(std::move(gate)), session_(std::move(session)), seq_(seq), gone_(std::move(gone)) {}

  void Send(int status, std::string type, std::string body, Headers extra) override {
    Post([=, this, type = std::move(type), body = std::move(body),
          extra = std::move(extra)](Session& s) mutable {
      s.Send(seq_, status, std::move(type), std::move(body), std::move(extra));
    });
  }
  void Begin(int status, std::string type, Headers extra) override {
    Post([=, this, type = std::move(type), extra = std::move(extra)](Session& s) mutable {
      s.Begin(seq_, status, std::move(type), std::move(extra));
    });
  }
  void Write(std::string data) override {
    if (data.empty() || gone()) return;
    Post([this, data = std::move(data)](Session& s) mutable { s.Write(seq_, std::move(data)); });
  }
  void End() override {
    Post([this](Session& s) { s.End(seq_); });
  }
  bool gone() const override { return gone_->load(); }
  void OnGone(std::function<void()> f) override {
    Post([this, f = std::move(f)](Session& s) mutable { s.OnGone(seq_, std::move(f)); });
  }

 private:
  // The closure keeps this Reply alive until it runs.
  template <typename F>
  void Post(F f) {
    gate_->Post([self = shared_from_this(), f = std::move(f)]() mutable {
      if (std::shared_ptr<Session> s = self->session_.lock()) f(*s);
    });
  }

  std::shared_ptr<Gate> gate_;
  std::weak_ptr<Session> session_;
  const uint64_t seq_;
  std::shared_ptr<std::atomic<bool>> gone_;
};

}  // namespace

void Session::ReadIdle() {
  if (closed_) return;
  if (buffer_.size() > 0) {
    ReadRequest();
    return;
  }
  stream_.expires_after(Chrono(srv_.options.idle_timeout));
  stream_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            if (ec) {
                              self->Close();
                              return;
                            }
                            self->buffer_.commit(n);
                            self->ReadRequest();
                          });
}

void Session::ReadRequest() {
  parser_.emplace();
  parser_->body_limit(srv_.options.max_body_bytes);
  parser_->header_limit(static_cast<uint32_t>(srv_.options.max_header_bytes));
  stream_.expires_after(Chrono(srv_.options.read_deadline));
  bhttp::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
}

void Session::OnRequest(beast::error_code ec) {
  if (closed_) return;
  if (ec) {
    // Bounds broken while reading get an answer, then the connection closes; a client that
    // went away or ran out its deadline is dropped.
    int status = 0;
    std::string message;
    if (ec == bhttp::error::body_limit) {
      status = 413;
      message =
          absl::StrFormat("the request body is larger than %d bytes", srv_.options.max_body_bytes);
    } else if (ec == bhttp::error::header_limit) {
      status = 431;
      message = absl::StrFormat("the request headers are larger than %d bytes",
                                srv_.options.max_header_bytes);
    } else if (ec.category() == bhttp::make_error_code(bhttp::error::body_limit).category() &&
               ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      status = 400;
      message = "malformed HTTP request: " + ec.message();
    }
    if (status == 0) {
      Close();
      return;
    }
    ++seq_;
    handling_ = true;
    began_ = ended_ = false;
    keep_alive_ = false;
    self_ = shared_from_this();
    gone_ = std::make_shared<std::atomic<bool>>(false);
    auto [type, body] = srv_.ErrorBody(status, message);
    Send(seq_, status, type, body, {});
    return;
  }
  stream_.expires_never();
  Dispatch(parser_->release());
}

void Session::Dispatch(bhttp::request<bhttp::string_body> req) {
  ++seq_;
  handling_ = true;
  began_ = ended_ = false;
  keep_alive_ = req.keep_alive();
  self_ = shared_from_this();
  gone_ = std::make_shared<std::atomic<bool>>(false);
  Watch();

  Request r;
  r.method = std::string(req.method_string());
  const std::string_view target(req.target().data(), req.target().size());
  r.path = std::string(target.substr(0, target.find('?')));
  for (const auto& field : req) {
    r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  r.body = std::move(req.body());
  beast::error_code ec;
  const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
  if (!ec) r.peer = absl::StrFormat("%s:%d", peer.address().to_string(), peer.port());

  auto it = srv_.routes.find(r.method + " " + r.path);
  if (it == srv_.routes.end()) {
    bool other_method = false;
    for (const auto& [key, handler] : srv_.routes) {
      other_method |= absl::EndsWith(key, " " + r.path);
    }
    const int status = other_method ? 405 : 404;
    auto [type, body] = srv_.ErrorBody(
        status, other_method ? absl::StrFormat("%s is not allowed on %s", r.method, r.path)
                             : absl::StrFormat("no such path: %s", r.path));
    Send(seq_, status, type, body, {});
    return;
  }
  auto reply = std::make_shared<Reply>(srv_.gate, weak_from_this(), seq_, gone_);
  it->second(std::move(r), reply);
}

// While a request is answered, the socket is watched: readable with nothing to read means the
// client closed it, and the handler hears so at once (OnGone) rather than at its next write.
void Session::Watch() {
  if (watching_ || closed_) return;
  watching_ = true;
  stream_.socket().async_wait(tcp::socket::wait_read,
                              [self = shared_from_this()](beast::error_code ec) {
                                self->watching_ = false;
                                if (self->closed_) return;
                                if (self->lingering_) {
                                  self->Linger();
                                  return;
                                }
                                if (!ec) {
                                  beast::error_code ec2;
                                  const size_t available = self->stream_.socket().available(ec2);
                                  if (ec2 || available == 0) {  // the client closed its side
                                    self->Close();
                                    return;
                                  }
                                  // A pipelined request: it waits in the socket until this response
                                  // ends.
                                } else if (ec != net::error::operation_aborted) {
                                  self->Close();
                                  return;
                                }
                                if (self->read_after_watch_) {
                                  self->read_after_watch_ = false;
                                  self->ReadIdle();
                                }
                              });
}

template <typename Body>
void Session::Prepare(bhttp::response<Body>& res, int status, const std::string& type,
                      const Headers& extra) {
  res.result(static_cast<unsigned>(status));
  res.version(11);
  res.set(bhttp::field::server, "sluice");
  if (!type.empty()) res.set(bhttp::field::content_type, type);
  for (const auto& [k, v] : extra) res.set(k, v);
  res.keep_alive(keep_alive_);
}

void Session::Send(uint64_t seq, int status, std::string type, std::string body, Headers extra) {
  if (seq != seq_ || !handling_ || began_ || ended_ || closed_) return;
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
  Prepare(*res, status, type, extra);
  res->body() = std::move(body);
  res->prepare_payload();
  ended_ = true;
  Enqueue({.kind = Out::kWhole, .whole = std::move(res)});
}

void Session::Begin(uint64_t seq, int status, std::string type, Headers extra) {
  if (seq != seq_ || !handling_ || began_ || ended_ || closed_) return;
  auto res = std::make_shared<bhttp::response<bhttp::empty_body>>();
  Prepare(*res, status, type, extra);
  res->chunked(true);
  began_ = true;
  Enqueue({.kind = Out::kHead, .head = std::move(res)});
}

void Session::Write(uint64_t seq, std::string data) {
  if (seq != seq_ || !began_ || ended_ || closed_ || data.empty()) return;
  unsent_ += data.size();
  if (unsent_ > srv_.options.max_unsent_bytes) {
    std::fprintf(stderr, "http: a client left %zu bytes of its response unread; dropping it\n",
                 unsent_);
    Close();
    return;
  }
  Enqueue({.kind = Out::kChunk, .data = std::move(data)});
}

void Session::End(uint64_t seq) {
  if (seq != seq_ || !handling_ || ended_) return;
  if (closed_) {
    self_.reset();
    return;
  }
  ended_ = true;
  if (began_) {
    Enqueue({.kind = Out::kLast});
  } else {  // ended without an answer: the client learns only that none came
    keep_alive_ = false;
    auto [type, body] = srv_.ErrorBody(500, "the server ended the request without an answer");
    ended_ = false;
    Send(seq, 500, type, body, {});
  }
}

void Session::OnGone(uint64_t seq, std::function<void()> f) {
  if (seq != seq_) return;
  if (closed_ || gone_->load()) {
    f();
    return;
  }
  if (!ended_) on_gone_ = std::move(f);
}

void Session::Enqueue(Out out) {
  queue_.push_back(std::move(out));
  if (!writing_) WriteNext();
}

void Session::WriteNext() {
  if (closed_) return;
  if (queue_.empty()) {
    writing_ = false;
    if (ended_) Finish();
    return;
  }
  writing_ = true;
  stream_.expires_after(Chrono(srv_.options.write_timeout));
  auto done = [self = shared_from_this()](beast::error_code ec, size_t) {
    if (self->closed_) return;
    if (ec) {
      self->Close();
      return;
    }
    self->unsent_ -= self->queue_.front().data.size();
    self->queue_.pop_front();
    self->WriteNext();
  };
  Out& o = queue_.front();
  switch (o.kind) {
    case Out::kWhole:
      bhttp::async_write(stream_, *o.whole, std::move(done));
      break;
    case Out::kHead:
      head_writer_ = std::make_unique<bhttp::response_serializer<bhttp::empty_body>>(*o.head);
      bhttp::async_write_header(stream_, *head_writer_, std::move(done));
      break;
    case Out::kChunk:
      net::async_write(stream_, bhttp::make_chunk(net::buffer(o.data)), std::move(done));
      break;
    case Out::kLast:
      net::async_write(stream_, bhttp::make_chunk_last(), std::move(done));
      break;
  }
}

// The response is written: the connection reads the next request, or closes.
void Session::Finish() {
  handling_ = false;
  on_gone_ = nullptr;
  head_writer_.reset();
  std::shared_ptr<Session> keep = std::move(self_);
  if (!keep_alive_) {
    Linger();
    return;
  }
  stream_.expires_never();
  if (watching_) {
    read_after_watch_ = true;
    beast::error_code ec;
    stream_.socket().cancel(ec);
  } else {
    ReadIdle();
  }
}

// A response that closes its connection: the sending side first, then what the client still
// sends is read and dropped (a second at most), so that its unread bytes do not turn the close
// into a reset that could overtake the answer (a 413 to a client still sending its body).
void Session::Linger() {
  if (closed_) return;
  if (!lingering_) {
    lingering_ = true;
    linger_until_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (watching_) {  // its handler comes back here
      stream_.socket().cancel(ec);
      return;
    }
  }
  if (std::chrono::steady_clock::now() >= linger_until_) {
    Close();
    return;
  }
  stream_.expires_at(linger_until_);
  auto scratch = std::make_shared<std::array<char, 4096>>();
  stream_.async_read_some(net::buffer(*scratch),
                          [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
                            if (ec) {
                              self->Close();
                            } else {
                              self->Linger();
                            }
                          });
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  if (gone_) gone_->store(true);
  std::shared_ptr<Session> keep = shared_from_this();
  if (on_gone_) {
    std::function<void()> f = std::move(on_gone_);
    on_gone_ = nullptr;
    f();
  }
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();  // pending writes return with an error; their buffers stay queued till then
  // A handler still answering ends its response into nothing; the session goes when it does
  // and every pending operation has returned.
  self_.reset();
}

void Server::Impl::Accept() {
  acceptor.async_accept(ioc, [this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (ec) {
      // Out of descriptors (or another passing failure): wait, rather than spin on it.
      std::fprintf(stderr, "http: accept failed: %s\n", ec.message().c_str());
      backoff.expires_after(std::chrono::milliseconds(50));
      backoff.async_wait([this](beast::error_code) {
        if (!stopping) Accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto s = std::make_shared<Session>(*this, std::move(socket));
    std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
    sessions.push_back(s);
    s->Start();
    Accept();
  });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options,
                                                      std::map<std::string, Handler> routes) {
  RaiseDescriptorLimit();
  auto impl = std::make_unique<Impl>(std::move(options), std::move(routes));
  const ServerOptions& o = impl->options;
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(o.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot listen on '%s': not an IP address (%s)", o.host, ec.message()));
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(o.port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrFormat("cannot listen on %s:%d (%s)", o.host, o.port, ec.message()));
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->ioc.run(); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::~Server() {
  {
    std::lock_guard<std::mutex> lock(impl_->gate->mu);
    impl_->gate->ioc = nullptr;
  }
  Impl* impl = impl_.get();
  net::post(impl->ioc, [impl] {
    impl->stopping = true;
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->backoff.cancel();
    for (const std::weak_ptr<Session>& w : impl->sessions) {
      if (std::shared_ptr<Session> s = w.lock()) s->Close();
    }
    impl->work.reset();
    // The cancelled operations' handlers are queued before this one: they run, then the loop
    // stops.
    net::post(impl->ioc, [impl] { impl->ioc.stop(); });
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Server::port() const { return impl_->port; }

int Server::connections() const { return impl_->open.load(); }

}  // namespace sluice::http
