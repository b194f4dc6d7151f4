// Embedding lookup on every backend against ref, for the table types of real models.
#include "kernels/ref/get_rows.h"

#include <random>
#include <vector>

#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

using testing::GuardedBuffer;
class GetRowsTest : public testing::OpTest<Op::kGetRows> {};

TEST_P(GetRowsTest, MatchesReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_1}) {
    SCOPED_TRACE(::testing::Message() << GgmlTypeName(uint32_t(type)) << " seed=" << seed);
    const int64_t rows = 50, dim = 96, count = 13;
    const GgmlTypeTraits* t = FindGgmlType(uint32_t(type));
    std::vector<uint8_t> table(rows * dim / t->block_size * t->type_size);
    for (auto& b : table) b = static_cast<uint8_t>(rng());
    if (type == GgmlType::kF32 || type == GgmlType::kF16) {
      // Keep values finite: rebuild the table from real numbers.
      std::vector<float> v = testing::RandomFloats(rng, rows * dim, -3.f, 3.f);
      for (int64_t i = 0; i < rows * dim; ++i) {
        if (type == GgmlType::kF32) {
          std::memcpy(&table[i * 4], &v[i], 4);
        } else {
          const uint16_t h = FloatToFp16(v[i]);
          std::memcpy(&table[i * 2], &h, 2);
        }
      }
    } else {
      for (int64_t b = 0; b < rows * dim / 32; ++b) {  // finite fp16 scales
        const uint16_t d = FloatToFp16(0.01f * (1 + b % 7));
        std::memcpy(&table[b * t->type_size], &d, 2);
        if (type == GgmlType::kQ4_1) std::memcpy(&table[b * t->type_size + 2], &d, 2);
      }
    }
    std::vector<int32_t> ids(count);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % rows);
    ids[0] = rows - 1;
    std::vector<float> want(count * dim);
    ref::GetRows({.table = table.data(),
                  .table_type = type,
                  .ids = ids.data(),
                  .out = want.data(),
                  .count = count,
                  .rows = rows,
                  .dim = dim});

    auto tb = backend_->Allocate(table.size());
    auto ib = backend_->Allocate(ids.size() * 4);
    auto ob = GuardedBuffer::Create(*backend_, want.size());
    ASSERT_TRUE(tb.ok() && ib.ok() && ob.ok());
    ASSERT_TRUE(backend_->CopyToDevice(*tb, table.data(), table.size()).ok());
    ASSERT_TRUE(backend_->CopyToDevice(*ib, ids.data(), ids.size() * 4).ok());
    ASSERT_TRUE(backend_
                    ->GetRows({.table = *tb,
                               .table_type = type,
                               .ids = static_cast<int32_t*>(*ib),
                               .out = ob->data(),
                               .count = count,
                               .rows = rows,
                               .dim = dim})
                    .ok());
    auto got = ob->DownloadChecked();
    backend_->Free(*tb);
    backend_->Free(*ib);
    ASSERT_TRUE(got.ok()) << got.status();
    testing::ExpectNear(*got, want, {0.f}, 0.f, "get_rows");  // dequantization is exact
  }
}

SLUICE_INSTANTIATE_OP_TEST(GetRowsTest);

}  // namespace
}  // namespace sluice::kernels
