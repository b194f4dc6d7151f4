// glog links and runs: a LOG line reaches a registered sink with its severity and text.
#include <string>
#include <vector>

#include "glog/logging.h"
#include "gtest/gtest.h"

namespace {

class CaptureSink : public google::LogSink {
 public:
  void send(google::LogSeverity severity, const char*, const char*, int,
            const google::LogMessageTime&, const char* message, size_t message_len) override {
    lines.emplace_back(std::string(google::GetLogSeverityName(severity)) + ": " +
                       std::string(message, message_len));
  }
  std::vector<std::string> lines;
};

TEST(GlogSmoke, SinkReceivesMessage) {
  CaptureSink sink;
  google::AddLogSink(&sink);
  LOG(WARNING) << "page pool at " << 97 << "%";
  google::RemoveLogSink(&sink);
  ASSERT_EQ(sink.lines.size(), 1u);
  EXPECT_EQ(sink.lines[0], "WARNING: page pool at 97%");
}

}  // namespace
