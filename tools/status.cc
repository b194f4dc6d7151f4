// sluice status: the workers of a running cluster, as its router sees them.
//
//   ./sluice status [--port 8000] [--host 127.0.0.1] [--json]
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, host, "127.0.0.1", "The router's address.");
ABSL_FLAG(int, port, 8000, "The router's HTTP port.");
ABSL_FLAG(bool, json, false, "Print {\"workers\": [...]} as JSON.");
ABSL_FLAG(std::string, api_key, "", "Bearer key, if the router asks for one.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string host = absl::GetFlag(FLAGS_host);
  const int port = absl::GetFlag(FLAGS_port);
  httplib::Client client(host, port);
  client.set_connection_timeout(2);
  httplib::Headers headers;
  if (!absl::GetFlag(FLAGS_api_key).empty()) {
    headers.emplace("Authorization", "Bearer " + absl::GetFlag(FLAGS_api_key));
  }
  auto res = client.Get("/v1/workers", headers);
  if (!res) {
    std::cerr << absl::StrFormat(
        "sluice status: no router at %s:%d (%s); is `./sluice up` running?\n", host, port,
        httplib::to_string(res.error()));
    return 1;
  }
  if (res->status != 200) {
    std::cerr << absl::StrFormat("sluice status: the router answered %d: %s\n", res->status,
                                 res->body);
    return 1;
  }
  const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("workers")) {
    std::cerr << "sluice status: the router's answer is not the workers' JSON\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("model %s, router http://%s:%d\n\n", j.value("model", ""), host,
                               port);
  std::cout << absl::StrFormat("%-12s %-8s %-9s %-21s %8s %8s %14s %14s %8s\n", "worker", "role",
                               "state", "address", "running", "waiting", "kv_pages_used",
                               "kv_pages_free", "ratio");
  for (const nlohmann::json& w : j["workers"]) {
    std::cout << absl::StrFormat(
        "%-12s %-8s %-9s %-21s %8d %8d %14d %14d %7.2fx\n", w.value("name", ""),
        w.value("role", ""), w.value("state", ""), w.value("address", ""),
        w.value("running", int64_t{0}), w.value("waiting", int64_t{0}),
        w.value("kv_pages_used", int64_t{0}), w.value("kv_pages_free", int64_t{0}),
        w.value("kv_compression_ratio", 0.0));
    if (!w.value("backend", "").empty()) std::cout << "    on " << w.value("backend", "") << "\n";
    if (!w.value("error", "").empty()) std::cout << "    last error: " << w["error"] << "\n";
  }
  return 0;
}
