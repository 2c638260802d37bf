// The host block cache (core/tensor.cpp): a freed block comes back for a request of its size class
// and always holds the bytes asked for (the sanitizer build catches a block too small), and the
// per-thread lists of blocks and of control blocks survive tensors freed on other threads.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "core/tensor.h"

using namespace mpq;

TEST_CASE("a freed host block comes back for its size and holds every byte asked for", "[memory]") {
  std::vector<size_t> sizes;
  for (size_t b = 1; b < 5000; b += 37) sizes.push_back(b);
  for (size_t b = 5000; b < (size_t{3} << 20); b = b * 9 / 8 + 13) sizes.push_back(b);
  for (size_t bytes : sizes) {
    INFO(bytes << " bytes");
    void* first = nullptr;
    {
      std::shared_ptr<void> block = host_alloc(bytes);
      REQUIRE(block);
      std::memset(block.get(), 0x5a, bytes);
      first = block.get();
    }
    // The last block freed on this thread in this size class is the next one handed out.
    std::shared_ptr<void> again = host_alloc(bytes);
    CHECK(again.get() == first);
    std::memset(again.get(), 0xa5, bytes);
    // A request one byte larger is in the same class or the next one; its block must hold it.
    again.reset();
    std::shared_ptr<void> larger = host_alloc(bytes + 1);
    std::memset(larger.get(), 0x3c, bytes + 1);
  }
}

TEST_CASE("host blocks and their control blocks freed on another thread are reused safely", "[memory]") {
  const size_t in_use = host_bytes_in_use();
  std::vector<Tensor> made;
  for (int i = 0; i < 200; ++i) made.push_back(Tensor::zeros(DType::Float32, {i % 7 + 1, 33}));
  // Freed by another thread: the blocks and control blocks go to that thread's lists.
  std::thread other([moved = std::move(made)]() mutable { moved.clear(); });
  other.join();
  CHECK(host_bytes_in_use() == in_use);
  for (int round = 0; round < 3; ++round) {
    std::vector<Tensor> again;
    for (int i = 0; i < 300; ++i) {
      again.push_back(Tensor::zeros(DType::Int64, {i % 5 + 1}));
      CHECK(again.back().data<int64_t>()[0] == 0);
    }
    std::vector<Tensor> copies = again;  // shared owners: freed only with the last one
    again.clear();
    for (const Tensor& t : copies) CHECK(t.data<int64_t>()[t.numel() - 1] == 0);
  }
  CHECK(host_bytes_in_use() == in_use);
}
