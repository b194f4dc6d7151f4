// prometheus-cpp core and pull link and run: a registry is serialized in the text format, and
// the same registry is scraped over HTTP from an Exposer on a loopback port.
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "httplib.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace {

TEST(PrometheusSmoke, SerializeAndScrape) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildCounter()
                     .Name("sluice_smoke_requests_total")
                     .Help("Requests seen by the smoke test.")
                     .Register(*registry);
  family.Add({{"route", "health"}}).Increment(3);

  const std::string text = prometheus::TextSerializer().Serialize(registry->Collect());
  EXPECT_NE(text.find("# TYPE sluice_smoke_requests_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("sluice_smoke_requests_total{route=\"health\"} 3"), std::string::npos)
      << text;

  prometheus::Exposer exposer("127.0.0.1:0");
  exposer.RegisterCollectable(registry);
  auto ports = exposer.GetListeningPorts();
  ASSERT_FALSE(ports.empty());
  httplib::Client client("127.0.0.1", ports.front());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("sluice_smoke_requests_total{route=\"health\"} 3"), std::string::npos);
}

}  // namespace
