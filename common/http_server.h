// sluice's HTTP/1.1 server: Boost.Beast on Boost.Asio, event-driven. Connections, requests
// being read and responses being streamed hold no thread: one I/O thread runs every socket,
// and a handler answers whenever it is ready, from any thread, through its Responder.
//
// Bounds a client cannot stretch: a connection that sends nothing for `idle_timeout` is closed;
// a request must arrive whole (headers and body) within `read_deadline` of its first byte; a
// header block past `max_header_bytes` or a body past `max_body_bytes` gets 431 or 413; a
// client that reads nothing for `write_timeout`, or leaves `max_unsent_bytes` of a response
// unread, is dropped. So slow sockets cost a file descriptor and a few KiB each, never a thread,
// and never delay another client's answer.
//
//   auto server = http::Server::Start({.port = 8000}, {
//       {"GET /health", [](http::Request, std::shared_ptr<http::Responder> r) {
//          r->Send(200, "application/json", "{}"); }}});
#ifndef SLUICE_COMMON_HTTP_SERVER_H_
#define SLUICE_COMMON_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query
  std::string body;
  Headers headers;   // as received
  std::string peer;  // the client's address

  // The first header named `name` (case-insensitive); empty when there is none.
  std::string Header(std::string_view name) const;
};

// The answer to one request: whole (Send) or streamed (Begin, Write..., End). Any thread may
// call it, at any time after the handler received it; the calls reach the connection's I/O
// thread in the order they were made. Every handler must end its response (Send or End), also
// when the client has gone: the connection is released when it does.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Send(int status, std::string content_type, std::string body, Headers extra = {}) = 0;
  // A chunked response: the status line and headers now, the body as it is written.
  virtual void Begin(int status, std::string content_type, Headers extra = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // Whether the client has gone: its connection closed or failed, or it stopped reading.
  virtual bool gone() const = 0;
  // Runs `f` once, on the I/O thread, when the client goes before the response ends (at once,
  // there, when it already has). A handler waiting on a worker cancels its call from it.
  virtual void OnGone(std::function<void()> f) = 0;
};

// Runs on the I/O thread: a handler must not block (hand slow work to another thread and
// answer through the Responder from there).
using Handler = std::function<void(Request, std::shared_ptr<Responder>)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  size_t max_body_bytes = 8 << 20;
  size_t max_header_bytes = 64 << 10;
  absl::Duration idle_timeout = absl::Seconds(75);   // before a request's first byte
  absl::Duration read_deadline = absl::Seconds(10);  // a whole request, from its first byte
  absl::Duration write_timeout = absl::Seconds(30);  // a write the client does not take
  size_t max_unsent_bytes = 8 << 20;                 // a response's bytes queued, unsent
  // The body of the errors the server itself answers (404, 405, 413, 431); the default is the
  // message as text/plain.
  std::function<std::pair<std::string, std::string>(int status, const std::string& message)>
      error_body;
};

class Server {
 public:
  // Routes: "METHOD /path" to its handler (exact paths). Listens on host:port and serves on an
  // I/O thread of its own; Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options,
                                                       std::map<std::string, Handler> routes);
  // Stops accepting, closes every connection and joins the I/O thread. A handler's Responder
  // outlives the server harmlessly: its calls do nothing.
  ~Server();

  int port() const;
  // Connections open now (for tests and metrics).
  int connections() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::http

#endif  // SLUICE_COMMON_HTTP_SERVER_H_
