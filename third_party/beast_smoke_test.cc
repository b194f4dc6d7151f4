// Boost.Beast parses an HTTP/1.1 request and serializes a chunked response.
#include <string>

#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "gtest/gtest.h"

namespace http = boost::beast::http;

TEST(BeastSmokeTest, ParsesARequestAndFramesAChunk) {
  const std::string wire =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  http::request_parser<http::string_body> parser;
  parser.eager(true);  // the body in the same call as the header
  boost::beast::error_code ec;
  EXPECT_EQ(parser.put(boost::asio::buffer(wire), ec), wire.size());
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(parser.is_done());
  EXPECT_EQ(parser.get().method(), http::verb::post);
  EXPECT_EQ(parser.get().target(), "/v1/completions");
  EXPECT_EQ(parser.get().body(), "{}");

  const std::string data = "data: x\n\n";
  auto chunk = http::make_chunk(boost::asio::buffer(data));
  EXPECT_EQ(boost::beast::buffers_to_string(chunk), "9\r\ndata: x\n\n\r\n");
}
