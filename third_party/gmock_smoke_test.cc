// GoogleMock links and runs: expectations on a mocked interface are checked.
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

class PageSource {
 public:
  virtual ~PageSource() = default;
  virtual int Allocate(int count) = 0;
};

class MockPageSource : public PageSource {
 public:
  MOCK_METHOD(int, Allocate, (int count), (override));
};

int AllocateTwice(PageSource& source) { return source.Allocate(2) + source.Allocate(3); }

TEST(GmockSmoke, ExpectationsAreChecked) {
  MockPageSource source;
  EXPECT_CALL(source, Allocate(testing::Gt(1))).Times(2).WillRepeatedly(testing::Return(10));
  EXPECT_EQ(AllocateTwice(source), 20);
}

}  // namespace
