// Bad inputs give ariadne::Error naming the tensor and the field, never a crash.
#include <string>

#include "common.hpp"

namespace ariadne {
namespace {

// Runs `p` expecting an error whose message contains every fragment.
void expect_error(const AttentionParams& p, std::initializer_list<const char*> fragments) {
  try {
    attention(p, Backend::reference);
    FAIL() << "expected an error mentioning " << *fragments.begin();
  } catch (const Error& e) {
    for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

struct Fixture {
  Buffer q{DType::f32, {10, 4, 8}}, k{DType::f32, {10, 2, 8}}, v{DType::f32, {10, 2, 8}}, out{DType::f32, {10, 4, 8}};
  AttentionParams p;
  Fixture() {
    q.fill_random(1);
    k.fill_random(2);
    v.fill_random(3);
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    p.out = out.view();
  }
};

TEST(Validation, GoodInputsPass) {
  Fixture f;
  EXPECT_NO_THROW(attention(f.p, Backend::reference));
}

TEST(Validation, ShapesDtypesStridesGqa) {
  {
    Fixture f;
    f.p.k.shape[2] = 7;
    expect_error(f.p, {"k", "head_dim"});
  }
  {
    Fixture f;
    f.p.q.rank = 2;
    expect_error(f.p, {"q", "rank"});
  }
  {
    Fixture f;
    Buffer kb(DType::bf16, {10, 2, 8});
    f.p.k = kb.view();
    expect_error(f.p, {"k", "dtype"});
  }
  {
    Fixture f;
    f.p.q.stride[2] = 2;
    expect_error(f.p, {"q", "contiguous"});
  }
  {
    Fixture f;
    Buffer k3(DType::f32, {10, 3, 8}), v3(DType::f32, {10, 3, 8});
    f.p.k = k3.view();
    f.p.v = v3.view();
    expect_error(f.p, {"GQA", "multiple"});
  }
  {
    Fixture f;
    f.p.v.shape[0] = 9;
    expect_error(f.p, {"v", "tokens"});
  }
  {
    Fixture f;
    f.p.out.shape[1] = 2;
    expect_error(f.p, {"out", "heads_q"});
  }
  {
    Fixture f;
    f.p.sink_mode = SinkMode::denominator;
    expect_error(f.p, {"sink"});
  }
  {
    Fixture f;
    Buffer lse(DType::f32, {10, 4});  // transposed
    f.p.lse = lse.view();
    expect_error(f.p, {"lse", "heads_q"});
  }
  {
    Fixture f;
    Buffer dist(DType::f32, {4, 10});
    f.p.distance = dist.view();
    expect_error(f.p, {"coords"});
  }
  {
    Fixture f;
    f.p.blocks_nnz = -2;  // the schedule hint: -1 (unknown) or a count
    expect_error(f.p, {"blocks_nnz", "-2"});
  }
}

TEST(Validation, PatternArrays) {
  Fixture f;
  int32_t cu[3] = {0, 4, 9};  // does not end at 10
  f.p.pattern = Pattern::full().with_varlen(2, cu);
  expect_error(f.p, {"cu_seqlens_q", "10"});
  BlockMask wrong_heads = BlockMask::from_lists(4, 2, {10}, std::vector<std::vector<int32_t>>(6));
  f.p.pattern = Pattern::full().with_blocks(wrong_heads.view());
  expect_error(f.p, {"blocks.heads"});
}

TEST(Validation, EmptyAndOneTokenSequencesAreValid) {
  // Empty sequences inside a packed batch are accepted and produce no rows (chunked prefill can
  // hand a zero-length chunk); one-token sequences are ordinary.
  Fixture f;
  int32_t cu[5] = {0, 0, 1, 1, 10};
  f.p.pattern = Pattern::causal().with_varlen(4, cu);
  EXPECT_NO_THROW(attention(f.p, Backend::reference));
}

TEST(Validation, UnknownNames) {
  EXPECT_THROW(parse_dtype("f8"), Error);
  EXPECT_EQ(parse_dtype("float64"), DType::f64);
  EXPECT_THROW(parse_backend("tpu"), Error);
  EXPECT_THROW(parse_sink_mode("both"), Error);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
}

TEST(Tensor, HalfConversionsRoundTripAndRound) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = uint16_t(h);
    const float f = f16_to_float(x);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), x) << "f16 " << h;
    ASSERT_EQ(float_to_bf16(bf16_to_float(x)), x) << "bf16 " << h;
  }
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie rounds to even
  EXPECT_EQ(float_to_f16(65520.f), 0x7c00);             // overflows to inf
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
}

}  // namespace
}  // namespace ariadne
