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
  // Sizes in the classes from 288 to 960 bytes and a few larger ones.
  std::vector<size_t> sizes;
  for (size_t b = 257; b < 1000; b += 29) sizes.push_back(b);
  for (size_t b = 4000; b < 200000; b = b * 3 / 2 + 7) sizes.push_back(b);
  auto fill = [&](std::vector<std::shared_ptr<void>>& blocks, unsigned char v) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      blocks.push_back(host_alloc(sizes[i]));
      std::memset(blocks.back().get(), v, sizes[i]);
    }
  };
  auto check = [&](const std::vector<std::shared_ptr<void>>& blocks, unsigned char v) {
    int64_t bad = 0;
    for (size_t i = 0; i < blocks.size(); ++i)
      for (size_t k = 0; k < sizes[i]; ++k) bad += static_cast<const unsigned char*>(blocks[i].get())[k] != v;
    return bad;
  };
  std::vector<std::shared_ptr<void>> made_here;
  fill(made_here, 1);
  std::vector<std::shared_ptr<void>> made_there;
  int64_t bad_there = -1;  // Catch's assertions are for the main thread only
  std::thread other([&] {
    made_here.clear();  // made on the main thread, freed here: into this thread's lists
    fill(made_there, 2);  // taken back from those lists (same sizes)
    bad_there = check(made_there, 2);
  });
  other.join();  // its remaining lists go to the shared cache
  CHECK(bad_there == 0);
  // Freed here, made there; then everything taken again here, every byte written and read back.
  CHECK(check(made_there, 2) == 0);
  made_there.clear();
  std::vector<std::shared_ptr<void>> again;
  fill(again, 3);
  CHECK(check(again, 3) == 0);
  again.clear();
  // The same through tensors, whose control blocks come from the per-thread lists.
  std::vector<Tensor> tensors;
  for (int i = 0; i < 200; ++i) tensors.push_back(Tensor::zeros(DType::Float32, {i % 7 + 1, 33}));
  int bad_tensors = -1;
  std::thread freer([&bad_tensors, moved = std::move(tensors)]() mutable {
    moved.clear();
    std::vector<Tensor> mine;
    for (int i = 0; i < 300; ++i) mine.push_back(Tensor::from<int64_t>({2}, {i, -i}));
    std::vector<Tensor> copies = mine;  // shared owners: freed with the last one
    mine.clear();
    bad_tensors = 0;
    for (int i = 0; i < 300; ++i) bad_tensors += copies[static_cast<size_t>(i)].data<int64_t>()[1] != -i;
  });
  freer.join();
  CHECK(bad_tensors == 0);
  CHECK(host_bytes_in_use() == in_use);
}
