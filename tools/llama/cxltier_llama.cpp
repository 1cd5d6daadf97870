// cxltier-llama: a serving loop over llama.cpp whose KV cache lives in a
// cxltier pool between turns (issue 33; docs/llama.md).
//
// Several conversations share a system prefix and take several turns each,
// round robin. After each turn the sequence's KV is read out of llama.cpp
// (llama_state_seq_get_data_ext), cut into 16-token blocks, written into a
// cxltier pool (page mode: one memfd pool the daemon moves pages of; copy
// mode: the daemon's tier pools under leases) and the sequence leaves the
// llama context. Before its next turn its blocks are read back from
// whichever tier holds them, checked against the hash taken when they were
// stored, and restored (llama_state_seq_set_data_ext). Every logit of every
// turn is compared bit for bit with a reference context per sequence that
// never evicts. Each layer's attention softmax (cb_eval, "kq_soft_max-<il>")
// is folded onto the KV heads (GQA) per block: n_layer x n_kv_head streams,
// reduced with AggregateStreams into one observation per block per turn.
// The scheduler hints the daemon: soon for the sequence that runs next, idle
// after a turn, done after the last.
//
//   cxltier-llama --model tiny.gguf --socket /run/c.sock --mode page --json out.json
#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cxltier/client.h"

namespace {

using cxltier::BlockKey;
using cxltier::Client;
using cxltier::HintKind;
using cxltier::Status;
using cxltier::Tier;

constexpr uint32_t kBlockTokens = 16;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "cxltier-llama: %s\n", what.c_str());
  std::exit(1);
}

struct Options {
  std::string model_path;
  std::string socket_path;
  std::string mode = "page";  // page or copy
  std::string json_path;
  uint32_t sequences = 8;
  uint32_t turns = 4;
  uint32_t prefix_tokens = 64;  // the system prompt every sequence shares
  uint32_t prompt_tokens = 96;  // a user turn: uniform in [prompt/2, 3 prompt/2]
  uint32_t gen_tokens = 16;     // tokens generated per turn (greedy)
  uint32_t context = 2048;
  uint32_t threads = 1;
  uint32_t think_ms = 0;  // the user's time between turns of the loop
  uint64_t seed = 1;
  bool hints = true;  // --hints off: the scheduler says nothing (to see what hints are worth)
  // --trace: conversations from a Mooncake trace instead of the generator.
  std::string trace_path;
  uint32_t trace_requests = 0;       // read only the first N requests (0: all)
  uint32_t trace_conversations = 8;  // the first N conversations with 2 or more turns
  uint32_t trace_block_tokens = 16;  // tokens per 512-token hash block
  uint32_t trace_max_blocks = 128;   // hash blocks kept per request (its first ones)
  bool trace_prefix = true;  // --trace-turns prefix: a turn keeps only the shared prefix's KV
};

void Usage() {
  std::fprintf(
      stderr,
      "usage: cxltier-llama --model FILE.gguf --socket PATH [--mode page|copy]\n"
      "  [--sequences N] [--turns N] [--prefix N] [--prompt N] [--gen N]\n"
      "  [--context N] [--threads N] [--think-ms N] [--seed N] [--hints on|off] [--json FILE]\n"
      "  [--trace FILE.jsonl [--trace-requests N] [--trace-conversations N]\n"
      "   [--trace-block-tokens N] [--trace-max-blocks N] [--trace-turns prefix|append]]\n");
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      Usage();
      std::exit(0);
    }
    if (i + 1 >= argc) {
      Usage();
      Die("option " + a + " needs a value");
    }
    const std::string v = argv[++i];
    auto num = [&]() -> uint64_t {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') Die("option " + a + ": not a number: " + v);
      return n;
    };
    if (a == "--model") {
      o.model_path = v;
    } else if (a == "--socket") {
      o.socket_path = v;
    } else if (a == "--mode") {
      o.mode = v;
    } else if (a == "--json") {
      o.json_path = v;
    } else if (a == "--sequences") {
      o.sequences = static_cast<uint32_t>(num());
    } else if (a == "--turns") {
      o.turns = static_cast<uint32_t>(num());
    } else if (a == "--prefix") {
      o.prefix_tokens = static_cast<uint32_t>(num());
    } else if (a == "--prompt") {
      o.prompt_tokens = static_cast<uint32_t>(num());
    } else if (a == "--gen") {
      o.gen_tokens = static_cast<uint32_t>(num());
    } else if (a == "--context") {
      o.context = static_cast<uint32_t>(num());
    } else if (a == "--threads") {
      o.threads = static_cast<uint32_t>(num());
    } else if (a == "--think-ms") {
      o.think_ms = static_cast<uint32_t>(num());
    } else if (a == "--hints") {
      if (v != "on" && v != "off") Die("--hints is on or off, not " + v);
      o.hints = v == "on";
    } else if (a == "--trace") {
      o.trace_path = v;
    } else if (a == "--trace-requests") {
      o.trace_requests = static_cast<uint32_t>(num());
    } else if (a == "--trace-conversations") {
      o.trace_conversations = static_cast<uint32_t>(num());
    } else if (a == "--trace-block-tokens") {
      o.trace_block_tokens = static_cast<uint32_t>(num());
    } else if (a == "--trace-turns") {
      if (v != "prefix" && v != "append") Die("--trace-turns is prefix or append, not " + v);
      o.trace_prefix = v == "prefix";
    } else if (a == "--trace-max-blocks") {
      o.trace_max_blocks = static_cast<uint32_t>(num());
    } else if (a == "--seed") {
      o.seed = num();
    } else {
      Usage();
      Die("unknown option " + a);
    }
  }
  if (o.model_path.empty() || o.socket_path.empty()) {
    Usage();
    Die("--model and --socket are required");
  }
  if (o.mode != "page" && o.mode != "copy") Die("--mode is page or copy, not " + o.mode);
  if (o.sequences == 0 || o.turns == 0 || o.prompt_tokens < 2) {
    Die("--sequences, --turns and --prompt (at least 2) must be positive");
  }
  if (o.trace_conversations == 0 || o.trace_block_tokens == 0 || o.trace_max_blocks == 0) {
    Die("--trace-conversations, --trace-block-tokens and --trace-max-blocks must be positive");
  }
  return o;
}

// ---- llama.cpp's sequence state, as llama 0.7.0 (Debian forky) writes it ----
//
// llama_state_seq_get_data_ext(ctx, buf, size, seq, 0) for a unified KV cache
// with flash attention off (so V is stored transposed):
//   12 bytes    a header this program does not interpret (0xaf143cd8, 0, 1:
//               the same in every state it has seen) and writes back verbatim
//   u32         cell_count: the sequence's cells, in cell order
//   cell_count x {i32 pos, u32 n_seq_id (1), i32 seq_id}
//   u32 v_trans, u32 n_layer
//   8 bytes     zero in every state seen; kept verbatim as well
//   n_layer x   {i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes}
//   n_layer x   v_trans ? {i32 v_type, u32 v_elem_bytes, u32 n_embd_v_gqa,
//                          n_embd_v_gqa x cell_count x v_elem_bytes}
//                       : {i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes}
// A K row is one token's keys of one layer, every KV head (n_embd_k_gqa values);
// a transposed V holds, for each of the n_embd_v_gqa dimensions, every cell.
//
// A cxltier block is 16 tokens x every layer x every KV head, token-major per
// layer:  for each layer: K[16][k_row_bytes], then V[16][n_embd_v_gqa x elem]
// (V un-transposed), tokens past the sequence's end zero. For the default
// model (4 layers, 1 KV head of 128, f16) that is 16 x 4 x (256 + 256) = 32 KiB,
// ModelGeometry::block_bytes().
struct StateLayout {
  uint8_t header[12] = {};
  uint32_t v_trans = 0;
  uint32_t n_layer = 0;
  uint8_t reserved[8] = {};
  std::vector<int32_t> k_type, v_type;
  std::vector<uint64_t> k_row;   // bytes of one token's K in a layer
  std::vector<uint32_t> v_elem;  // v_trans: bytes of one value
  std::vector<uint32_t> v_n;     // v_trans: n_embd_v_gqa
  std::vector<uint64_t> v_row;   // bytes of one token's V in a layer
  uint64_t block_bytes() const {
    uint64_t b = 0;
    for (uint32_t l = 0; l < n_layer; ++l) b += kBlockTokens * (k_row[l] + v_row[l]);
    return b;
  }
};

// One parsed state: the layout plus where each layer's data starts.
struct ParsedState {
  uint32_t cells = 0;
  std::vector<size_t> k_off, v_off;
};

class Reader {
 public:
  Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  T Get() {
    if (off_ + sizeof(T) > b_.size()) Die("llama state: truncated at byte " + std::to_string(off_));
    T v;
    std::memcpy(&v, b_.data() + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  void Skip(uint64_t n) {
    if (off_ + n > b_.size()) Die("llama state: truncated at byte " + std::to_string(off_));
    off_ += n;
  }
  size_t off() const { return off_; }

 private:
  const std::vector<uint8_t>& b_;
  size_t off_ = 0;
};

// Parses a state blob; fills *layout on the first call and checks every later
// blob has the same one. Positions must be 0..cells-1 in cell order (a sequence
// alone in a context cleared before it was restored).
ParsedState ParseState(const std::vector<uint8_t>& blob, StateLayout* layout, bool first) {
  Reader r(blob);
  ParsedState p;
  uint8_t header[12];
  for (auto& h : header) h = r.Get<uint8_t>();
  if (first) {
    std::memcpy(layout->header, header, sizeof(header));
  } else if (std::memcmp(layout->header, header, sizeof(header)) != 0) {
    Die("llama state: the header changed between sequences");
  }
  p.cells = r.Get<uint32_t>();
  for (uint32_t i = 0; i < p.cells; ++i) {
    const int32_t pos = r.Get<int32_t>();
    const uint32_t n_seq = r.Get<uint32_t>();
    if (pos != static_cast<int32_t>(i)) {
      Die("llama state: cell " + std::to_string(i) + " holds position " + std::to_string(pos) +
          " (cells out of position order)");
    }
    r.Skip(uint64_t{n_seq} * 4);
  }
  const uint32_t v_trans = r.Get<uint32_t>();
  const uint32_t n_layer = r.Get<uint32_t>();
  uint8_t reserved[8];
  for (auto& x : reserved) x = r.Get<uint8_t>();
  if (first) {
    std::memcpy(layout->reserved, reserved, sizeof(reserved));
    layout->v_trans = v_trans;
    layout->n_layer = n_layer;
    layout->k_type.assign(n_layer, 0);
    layout->v_type.assign(n_layer, 0);
    layout->k_row.assign(n_layer, 0);
    layout->v_elem.assign(n_layer, 0);
    layout->v_n.assign(n_layer, 0);
    layout->v_row.assign(n_layer, 0);
  } else if (v_trans != layout->v_trans || n_layer != layout->n_layer ||
             std::memcmp(reserved, layout->reserved, sizeof(reserved)) != 0) {
    Die("llama state: v_trans, n_layer or the bytes after them changed");
  }
  p.k_off.resize(n_layer);
  p.v_off.resize(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) {
    const int32_t type = r.Get<int32_t>();
    const uint64_t row = r.Get<uint64_t>();
    if (first) {
      layout->k_type[l] = type;
      layout->k_row[l] = row;
    } else if (type != layout->k_type[l] || row != layout->k_row[l]) {
      Die("llama state: layer " + std::to_string(l) + "'s K changed type or size");
    }
    p.k_off[l] = r.off();
    r.Skip(row * p.cells);
  }
  for (uint32_t l = 0; l < n_layer; ++l) {
    const int32_t type = r.Get<int32_t>();
    uint32_t elem = 0, n = 0;
    uint64_t row = 0;
    if (v_trans) {
      elem = r.Get<uint32_t>();
      n = r.Get<uint32_t>();
      row = uint64_t{elem} * n;
    } else {
      row = r.Get<uint64_t>();
    }
    if (first) {
      layout->v_type[l] = type;
      layout->v_elem[l] = elem;
      layout->v_n[l] = n;
      layout->v_row[l] = row;
    } else if (type != layout->v_type[l] || row != layout->v_row[l] || elem != layout->v_elem[l]) {
      Die("llama state: layer " + std::to_string(l) + "'s V changed type or size");
    }
    p.v_off[l] = r.off();
    r.Skip(row * p.cells);
  }
  if (r.off() != blob.size()) {
    Die("llama state: " + std::to_string(blob.size() - r.off()) +
        " bytes after the last layer (a layout this program does not know)");
  }
  return p;
}

// Writes block `b` (tokens 16b .. 16b+15) of a parsed state into dst.
void StateToBlock(const std::vector<uint8_t>& blob, const StateLayout& L, const ParsedState& p,
                  uint32_t b, uint8_t* dst) {
  const uint8_t* src = blob.data();
  for (uint32_t l = 0; l < L.n_layer; ++l) {
    for (uint32_t t = 0; t < kBlockTokens; ++t, dst += L.k_row[l]) {
      const uint64_t pos = uint64_t{b} * kBlockTokens + t;
      if (pos < p.cells) {
        std::memcpy(dst, src + p.k_off[l] + pos * L.k_row[l], L.k_row[l]);
      } else {
        std::memset(dst, 0, L.k_row[l]);
      }
    }
    for (uint32_t t = 0; t < kBlockTokens; ++t, dst += L.v_row[l]) {
      const uint64_t pos = uint64_t{b} * kBlockTokens + t;
      if (pos >= p.cells) {
        std::memset(dst, 0, L.v_row[l]);
      } else if (!L.v_trans) {
        std::memcpy(dst, src + p.v_off[l] + pos * L.v_row[l], L.v_row[l]);
      } else {
        const uint32_t e = L.v_elem[l];
        for (uint32_t j = 0; j < L.v_n[l]; ++j) {
          std::memcpy(dst + uint64_t{j} * e, src + p.v_off[l] + (uint64_t{j} * p.cells + pos) * e,
                      e);
        }
      }
    }
  }
}

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

// The state blob of a sequence of `cells` tokens (seq id 0) from its blocks.
std::vector<uint8_t> BlocksToState(const StateLayout& L, uint32_t cells,
                                   const std::vector<const uint8_t*>& blocks) {
  std::vector<uint8_t> out(L.header, L.header + sizeof(L.header));
  Put<uint32_t>(&out, cells);
  for (uint32_t i = 0; i < cells; ++i) {
    Put<int32_t>(&out, static_cast<int32_t>(i));
    Put<uint32_t>(&out, 1);
    Put<int32_t>(&out, 0);
  }
  Put<uint32_t>(&out, L.v_trans);
  Put<uint32_t>(&out, L.n_layer);
  out.insert(out.end(), L.reserved, L.reserved + sizeof(L.reserved));
  // Where layer l's K and V start inside a block.
  std::vector<uint64_t> k_in(L.n_layer), v_in(L.n_layer);
  uint64_t at = 0;
  for (uint32_t l = 0; l < L.n_layer; ++l) {
    k_in[l] = at;
    v_in[l] = at + kBlockTokens * L.k_row[l];
    at = v_in[l] + kBlockTokens * L.v_row[l];
  }
  for (uint32_t l = 0; l < L.n_layer; ++l) {
    Put<int32_t>(&out, L.k_type[l]);
    Put<uint64_t>(&out, L.k_row[l]);
    for (uint32_t pos = 0; pos < cells; ++pos) {
      const uint8_t* row = blocks[pos / kBlockTokens] + k_in[l] + (pos % kBlockTokens) * L.k_row[l];
      out.insert(out.end(), row, row + L.k_row[l]);
    }
  }
  for (uint32_t l = 0; l < L.n_layer; ++l) {
    Put<int32_t>(&out, L.v_type[l]);
    if (L.v_trans) {
      Put<uint32_t>(&out, L.v_elem[l]);
      Put<uint32_t>(&out, L.v_n[l]);
      const uint32_t e = L.v_elem[l];
      for (uint32_t j = 0; j < L.v_n[l]; ++j) {
        for (uint32_t pos = 0; pos < cells; ++pos) {
          const uint8_t* v = blocks[pos / kBlockTokens] + v_in[l] +
                             (pos % kBlockTokens) * L.v_row[l] + uint64_t{j} * e;
          out.insert(out.end(), v, v + e);
        }
      }
    } else {
      Put<uint64_t>(&out, L.v_row[l]);
      for (uint32_t pos = 0; pos < cells; ++pos) {
        const uint8_t* row =
            blocks[pos / kBlockTokens] + v_in[l] + (pos % kBlockTokens) * L.v_row[l];
        out.insert(out.end(), row, row + L.v_row[l]);
      }
    }
  }
  return out;
}

// ---- attention scores from cb_eval ----

// Each layer's softmax "kq_soft_max-<il>" is [n_kv keys, n_tokens queries,
// n_head, 1] in f32. Its mass on the sequence's cells is folded per
// 16-token block onto the stream (layer, KV head = query head / GQA group).
struct Scores {
  bool enabled = false;  // false in the reference contexts: the callback only reads
  uint32_t n_layer = 0, n_head = 0, n_head_kv = 0;
  uint32_t cells = 0;      // the sequence's cells while this batch runs (keys beyond: masked)
  std::vector<float> acc;  // [block][layer][kv head]
  std::vector<float> tmp;
  uint64_t tensors = 0;

  uint64_t streams() const { return uint64_t{n_layer} * n_head_kv; }
};

bool EvalCallback(ggml_tensor* t, bool ask, void* user) {
  const bool wanted = std::strncmp(t->name, "kq_soft_max-", 12) == 0;
  if (ask) return wanted;
  auto* s = static_cast<Scores*>(user);
  if (!wanted || !s->enabled) return true;
  if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) Die("kq_soft_max is not contiguous f32");
  const uint32_t il = static_cast<uint32_t>(std::atoi(t->name + 12));
  const int64_t n_kv = t->ne[0], n_q = t->ne[1], n_head = t->ne[2];
  if (n_head != s->n_head || il >= s->n_layer) Die("kq_soft_max has an unexpected shape");
  s->tmp.resize(static_cast<size_t>(ggml_nelements(t)));
  ggml_backend_tensor_get(t, s->tmp.data(), 0, ggml_nbytes(t));
  const uint32_t group = s->n_head / s->n_head_kv;
  const int64_t keys = std::min<int64_t>(n_kv, s->cells);
  const size_t need = (static_cast<size_t>(keys) + kBlockTokens - 1) / kBlockTokens * s->streams();
  if (s->acc.size() < need) s->acc.resize(need, 0.0f);
  for (int64_t h = 0; h < n_head; ++h) {
    const uint64_t stream = uint64_t{il} * s->n_head_kv + static_cast<uint64_t>(h) / group;
    for (int64_t q = 0; q < n_q; ++q) {
      const float* row = s->tmp.data() + (h * n_q + q) * n_kv;
      for (int64_t j = 0; j < keys; ++j) {
        s->acc[static_cast<size_t>(j / kBlockTokens) * s->streams() + stream] += row[j];
      }
    }
  }
  ++s->tensors;
  return true;
}

// ---- the pool ----

struct Figures {
  uint64_t tokens_decoded = 0;
  uint64_t turns = 0;
  uint64_t blocks_stored = 0;  // block writes (a partial last block is written again)
  uint64_t blocks_admitted = 0;
  uint64_t blocks_restored = 0;
  std::vector<uint64_t> restores_from_tier;
  std::vector<double> restore_seconds_by_tier;
  uint64_t corrupt_blocks = 0;
  uint64_t logit_rows = 0;
  uint64_t logit_rows_differing = 0;
  uint64_t observations = 0;
  uint64_t hints = 0;
  uint64_t hints_applied = 0;
  uint64_t trace_requests = 0;  // trace requests served as turns
};

class Pool {
 public:
  Pool(Client* c, bool copy, uint32_t capacity, uint64_t block_bytes)
      : c_(c), copy_(copy), block_bytes_(block_bytes) {
    if (copy_) {
      if (Status st = c_->CreateTierPools(capacity); !st.ok()) Die("tier pools: " + st.message);
      Status st;
      reader_ = c_->NewReader(&st);
      if (!reader_) Die("reader: " + st.message);
      return;
    }
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    stride_ = (block_bytes + page - 1) / page * page;
    bytes_ = stride_ * capacity;
    capacity_ = capacity;
    fd_ = memfd_create("cxltier-llama-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) Die("memfd for the pool");
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) Die("cannot map the pool");
    base_ = static_cast<uint8_t*>(p);
    if (Status st = c_->RegisterMemfdPool(fd_, bytes_, stride_, capacity, &pool_id_); !st.ok()) {
      Die("register pool: " + st.message);
    }
  }
  ~Pool() {
    reader_.reset();
    if (base_) munmap(base_, bytes_);
    if (fd_ >= 0) close(fd_);
  }

  // Writes a block's bytes under `key`, admitting it the first time; its slot.
  uint32_t Store(const BlockKey& key, uint32_t known_slot, const uint8_t* bytes, bool* admitted) {
    std::vector<cxltier::wire::AdmitResult> res;
    *admitted = known_slot == UINT32_MAX;
    if (copy_) {
      uint32_t slot = known_slot;
      uint8_t* dst = nullptr;
      if (slot == UINT32_MAX) {
        if (Status st = c_->Admit(c_->tier_pool(0), {{{key, 0}}}, &res); !st.ok()) {
          Die("admit: " + st.message);
        }
        slot = res[0].slot;
        dst = c_->WriteAddress(slot);
        if (!dst) Die("no write lease after admit");
      } else if (Status st = c_->BeginWrite(slot, &dst); !st.ok()) {
        Die("begin write: " + st.message);
      }
      std::memcpy(dst, bytes, block_bytes_);
      if (Status st = c_->EndWrite(slot); !st.ok()) Die("end write: " + st.message);
      return slot;
    }
    if (known_slot != UINT32_MAX) {
      std::memcpy(base_ + index_of_slot_.at(known_slot) * stride_, bytes, block_bytes_);
      return known_slot;
    }
    if (next_index_ >= capacity_) Die("the pool is full");
    const uint32_t index = next_index_++;
    // Admitted before it is written: its pages land where the daemon placed it.
    if (Status st = c_->Admit(pool_id_, {{{key, index}}}, &res); !st.ok()) {
      Die("admit: " + st.message);
    }
    std::memcpy(base_ + uint64_t{index} * stride_, bytes, block_bytes_);
    const uint32_t slot = res[0].slot;
    if (index_of_slot_.size() <= slot) index_of_slot_.resize(slot + 1, UINT32_MAX);
    index_of_slot_[slot] = index;
    return slot;
  }

  // Copies a block's bytes out of whichever tier holds them; that tier.
  Tier Read(uint32_t slot, uint8_t* dst) {
    if (copy_) {
      Client::Reader::Lease lease;
      if (Status st = reader_->Acquire(slot, &lease); !st.ok()) Die("read lease: " + st.message);
      std::memcpy(dst, lease.data, block_bytes_);
      const Tier tier = lease.tier;
      if (Status st = reader_->Release(lease); !st.ok()) Die("release lease: " + st.message);
      return tier;
    }
    const Tier tier = c_->TierOf(slot);
    std::memcpy(dst, base_ + uint64_t{index_of_slot_.at(slot)} * stride_, block_bytes_);
    return tier;
  }

 private:
  Client* c_;
  bool copy_;
  uint64_t block_bytes_;
  std::unique_ptr<Client::Reader> reader_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t stride_ = 0, bytes_ = 0;
  uint32_t capacity_ = 0, next_index_ = 0, pool_id_ = 0;
  std::vector<uint32_t> index_of_slot_;
};

// ---- the Mooncake trace (--trace; docs/llama.md, "The trace run") ----

// One line of the trace: {"timestamp": .., "input_length": .., "output_length": ..,
// "hash_ids": [..]}, each hash id naming a 512-token block of the prompt.
struct TraceRequest {
  uint64_t line = 0;
  uint64_t timestamp = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

uint64_t JsonNumber(const std::string& l, const char* key, size_t* at) {
  const size_t k = l.find(key);
  if (k == std::string::npos) Die(std::string("trace line without ") + key + ": " + l);
  size_t i = l.find(':', k) + 1;
  while (i < l.size() && l[i] == ' ') ++i;
  char* end = nullptr;
  const uint64_t v = std::strtoull(l.c_str() + i, &end, 10);
  if (end == l.c_str() + i) Die(std::string("trace: no number for ") + key + ": " + l);
  if (at) *at = static_cast<size_t>(end - l.c_str());
  return v;
}

std::vector<TraceRequest> ReadTrace(const std::string& path, uint32_t limit) {
  std::ifstream in(path);
  if (!in) Die("cannot read " + path);
  std::vector<TraceRequest> out;
  std::string l;
  for (uint64_t n = 0; std::getline(in, l); ++n) {
    if (l.empty()) continue;
    if (limit && out.size() == limit) break;
    TraceRequest r;
    r.line = n;
    r.timestamp = JsonNumber(l, "\"timestamp\"", nullptr);
    r.output_length = JsonNumber(l, "\"output_length\"", nullptr);
    size_t i = l.find('[', l.find("\"hash_ids\""));
    if (l.find("\"hash_ids\"") == std::string::npos || i == std::string::npos) {
      Die("trace line without hash_ids: " + l);
    }
    for (++i; i < l.size() && l[i] != ']';) {
      if (l[i] == ' ' || l[i] == ',') {
        ++i;
        continue;
      }
      char* end = nullptr;
      r.hash_ids.push_back(std::strtoull(l.c_str() + i, &end, 10));
      if (end == l.c_str() + i) Die("trace: bad hash_ids: " + l);
      i = static_cast<size_t>(end - l.c_str());
    }
    if (r.hash_ids.empty()) Die("trace: a request without hash ids: " + l);
    out.push_back(std::move(r));
  }
  return out;
}

// ---- the loop ----

// One turn of one sequence, in the order the loop runs them.
struct Event {
  uint32_t seq = 0;
  std::vector<llama_token> input;  // appended to the sequence's KV
  uint32_t gen = 0;                // tokens generated after it (greedy)
  bool last = false;               // the sequence's last turn
  uint32_t keep = UINT32_MAX;      // cells of the sequence's KV the turn keeps (the rest: dropped)
  uint64_t trace_line = 0;
};

struct Sequence {
  uint32_t group = 0;  // hint group: id + 1
  uint32_t cells = 0;  // tokens in its KV
  std::vector<uint32_t> slots;
  std::vector<uint64_t> hashes;
  std::vector<BlockKey> keys;
  llama_context* reference = nullptr;
};

llama_context* NewContext(llama_model* m, const Options& o, Scores* scores) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = o.context;
  p.n_batch = 512;
  p.n_ubatch = 512;
  p.n_seq_max = 1;
  p.n_threads = static_cast<int32_t>(o.threads);
  p.n_threads_batch = static_cast<int32_t>(o.threads);
  p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // the softmax is a tensor of its own
  p.cb_eval = EvalCallback;
  p.cb_eval_user_data = scores;
  llama_context* c = llama_init_from_model(m, p);
  if (!c) Die("cannot make a llama context");
  return c;
}

// Decodes `tokens` after the sequence's `cells` in both contexts, in batches
// of at most 512 (n_batch); compares each batch's last logits bit for bit.
void Decode(llama_context* served, llama_context* reference, std::vector<llama_token>& tokens,
            int n_vocab, Figures* f, Scores* scores, uint32_t cells) {
  for (size_t at = 0; at < tokens.size(); at += 512) {
    const int32_t n = static_cast<int32_t>(std::min<size_t>(512, tokens.size() - at));
    scores->cells = cells + static_cast<uint32_t>(at) + static_cast<uint32_t>(n);
    llama_batch b = llama_batch_get_one(tokens.data() + at, n);
    if (llama_decode(reference, b) != 0) Die("llama_decode (reference) failed");
    b = llama_batch_get_one(tokens.data() + at, n);
    if (llama_decode(served, b) != 0) Die("llama_decode failed");
    const float* a = llama_get_logits_ith(served, -1);
    const float* r = llama_get_logits_ith(reference, -1);
    ++f->logit_rows;
    if (std::memcmp(a, r, sizeof(float) * static_cast<size_t>(n_vocab)) != 0) {
      ++f->logit_rows_differing;
    }
  }
  f->tokens_decoded += tokens.size();
}

llama_token Argmax(const float* logits, int n) {
  return static_cast<llama_token>(std::max_element(logits, logits + n) - logits);
}

std::string Json(const Options& o, const Figures& f, uint64_t streams, uint64_t block_bytes,
                 double seconds) {
  uint64_t reads = 0;
  for (uint64_t n : f.restores_from_tier) reads += n;
  auto list = [](const auto& v, bool per_block, const std::vector<uint64_t>& n) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ", ";
      if (per_block) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.2f", n[i] ? 1e6 * v[i] / n[i] : 0.0);
        s += buf;
      } else {
        s += std::to_string(v[i]);
      }
    }
    return s + "]";
  };
  char hit[32];
  std::snprintf(hit, sizeof(hit), "%.4f",
                reads ? static_cast<double>(f.restores_from_tier[0]) / reads : 0.0);
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.2f", seconds);
  std::string s = "{";
  s += "\"mode\": \"" + o.mode + "\"";
  s += ", \"sequences\": " + std::to_string(o.sequences);
  s += std::string(", \"workload\": \"") + (o.trace_path.empty() ? "generator" : "trace") + "\"";
  if (!o.trace_path.empty()) {
    s += ", \"trace_requests\": " + std::to_string(f.trace_requests);
    s += ", \"trace_block_tokens\": " + std::to_string(o.trace_block_tokens);
    s += std::string(", \"trace_turns\": \"") + (o.trace_prefix ? "prefix" : "append") + "\"";
  }
  s += ", \"tokens_decoded\": " + std::to_string(f.tokens_decoded);
  s += ", \"turns\": " + std::to_string(f.turns);
  s += ", \"block_bytes\": " + std::to_string(block_bytes);
  s += ", \"blocks_stored\": " + std::to_string(f.blocks_stored);
  s += ", \"blocks_admitted\": " + std::to_string(f.blocks_admitted);
  s += ", \"blocks_restored\": " + std::to_string(f.blocks_restored);
  s += ", \"restores_from_tier\": " + list(f.restores_from_tier, false, f.restores_from_tier);
  s += ", \"restore_us_per_block_by_tier\": " +
       list(f.restore_seconds_by_tier, true, f.restores_from_tier);
  s += ", \"logit_rows_compared\": " + std::to_string(f.logit_rows);
  s += std::string(", \"logits_bit_identical\": ") +
       (f.logit_rows && f.logit_rows_differing == 0 ? "true" : "false");
  s += ", \"streams\": " + std::to_string(streams);
  s += ", \"observations\": " + std::to_string(f.observations);
  s += std::string(", \"hints_on\": ") + (o.hints ? "true" : "false");
  s += ", \"hints\": " + std::to_string(f.hints);
  s += ", \"hints_applied\": " + std::to_string(f.hints_applied);
  s += std::string(", \"hit_rate\": ") + hit;
  s += ", \"corrupt_blocks\": " + std::to_string(f.corrupt_blocks);
  s += std::string(", \"seconds\": ") + secs;
  return s + "}";
}

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseOptions(argc, argv);
  const auto t0 = std::chrono::steady_clock::now();
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.progress_callback = [](float, void*) { return true; };  // no progress dots
  llama_model* model = llama_model_load_from_file(o.model_path.c_str(), mp);
  if (!model) Die("cannot load " + o.model_path);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  cxltier::ModelGeometry geo;
  geo.name = "cxltier-llama";
  geo.layers = static_cast<uint32_t>(llama_model_n_layer(model));
  geo.query_heads = static_cast<uint32_t>(llama_model_n_head(model));
  geo.kv_heads = static_cast<uint32_t>(llama_model_n_head_kv(model));
  geo.head_dim = static_cast<uint32_t>(llama_model_n_embd(model)) / geo.query_heads;
  geo.dtype_bytes = 2;  // f16 K and V: llama.cpp's default cache type (checked below)
  geo.block_tokens = kBlockTokens;
  if (Status st = geo.Validate(); !st.ok()) Die("model geometry: " + st.message);

  // The workload, as a list of turns in the order the loop runs them.
  std::vector<Event> events;
  std::mt19937_64 rng(o.seed);
  auto random_tokens = [&](uint32_t n) {
    std::vector<llama_token> t(n);
    for (auto& x : t) x = static_cast<llama_token>(4 + rng() % (n_vocab - 4));
    return t;
  };
  uint64_t trace_requests = 0;
  if (o.trace_path.empty()) {
    // A shared system prefix, then turns of user tokens (random bytes of the
    // byte-fallback vocabulary) each followed by greedy generation; round robin.
    std::vector<llama_token> prefix = random_tokens(o.prefix_tokens);
    prefix.insert(prefix.begin(), llama_vocab_bos(vocab));
    for (uint32_t turn = 0; turn < o.turns; ++turn) {
      for (uint32_t i = 0; i < o.sequences; ++i) {
        Event e;
        e.seq = i;
        if (turn == 0) e.input = prefix;
        const uint32_t n_user =
            o.prompt_tokens / 2 + static_cast<uint32_t>(rng() % (o.prompt_tokens + 1));
        const std::vector<llama_token> user = random_tokens(n_user);
        e.input.insert(e.input.end(), user.begin(), user.end());
        e.gen = o.gen_tokens;
        e.last = turn + 1 == o.turns;
        events.push_back(std::move(e));
      }
    }
  } else {
    // The Mooncake trace at small scale: a conversation is the requests
    // sharing a first hash id (no request extends another's whole prefix),
    // its turns in timestamp order; the first --trace-conversations such
    // conversations with two turns or more. A hash block is
    // --trace-block-tokens tokens drawn from a generator seeded by the hash id,
    // so equal hash ids are equal tokens. Turn 1 is BOS and its request's
    // blocks; a later turn appends the blocks past those it shares with the
    // turn before (the shared ones are the KV restored from the pool). Each
    // turn generates output_length scaled the same way (at least 1, at most --gen).
    const std::vector<TraceRequest> trace = ReadTrace(o.trace_path, o.trace_requests);
    std::vector<std::vector<const TraceRequest*>> groups;
    std::unordered_map<uint64_t, size_t> group_of;
    for (const TraceRequest& r : trace) {
      auto [it, fresh] = group_of.try_emplace(r.hash_ids[0], groups.size());
      if (fresh) groups.emplace_back();
      groups[it->second].push_back(&r);
    }
    std::vector<std::pair<const TraceRequest*, uint32_t>> turns;  // request, sequence
    uint32_t n_seq = 0;
    for (auto& g : groups) {
      if (g.size() < 2) continue;
      if (n_seq == o.trace_conversations) break;
      for (const TraceRequest* r : g) turns.emplace_back(r, n_seq);
      ++n_seq;
    }
    if (n_seq == 0) Die("no conversation with two turns in " + o.trace_path);
    std::stable_sort(turns.begin(), turns.end(), [](const auto& x, const auto& y) {
      return x.first->timestamp != y.first->timestamp ? x.first->timestamp < y.first->timestamp
                                                      : x.first->line < y.first->line;
    });
    auto block_tokens = [&](uint64_t hash_id) {
      std::mt19937_64 r(o.seed * 0x9E3779B97F4A7C15ULL + hash_id);
      std::vector<llama_token> t(o.trace_block_tokens);
      for (auto& x : t) x = static_cast<llama_token>(4 + r() % (n_vocab - 4));
      return t;
    };
    std::vector<std::vector<uint64_t>> last_blocks(n_seq);
    std::vector<uint32_t> remaining(n_seq, 0);
    for (const auto& t : turns) ++remaining[t.second];
    for (const auto& [r, seq] : turns) {
      Event e;
      e.seq = seq;
      e.trace_line = r->line;
      std::vector<uint64_t> blocks(
          r->hash_ids.begin(),
          r->hash_ids.begin() + std::min<size_t>(r->hash_ids.size(), o.trace_max_blocks));
      std::vector<uint64_t>& prev = last_blocks[seq];
      size_t shared = 0;
      while (shared < prev.size() && shared < blocks.size() && prev[shared] == blocks[shared]) {
        ++shared;
      }
      if (prev.empty()) e.input.push_back(llama_vocab_bos(vocab));
      if (shared == blocks.size()) shared = blocks.size() - 1;  // never an empty turn
      // prefix: the KV past BOS and the shared blocks (the previous turn's
      // tail and answer) is dropped, as the trace's request does not hold it.
      if (!prev.empty() && o.trace_prefix) {
        e.keep = 1 + static_cast<uint32_t>(shared) * o.trace_block_tokens;
      }
      for (size_t k = shared; k < blocks.size(); ++k) {
        const std::vector<llama_token> t = block_tokens(blocks[k]);
        e.input.insert(e.input.end(), t.begin(), t.end());
      }
      const uint64_t scaled = (r->output_length * o.trace_block_tokens + 256) / 512;
      e.gen = static_cast<uint32_t>(std::clamp<uint64_t>(scaled, 1, std::max(1u, o.gen_tokens)));
      e.last = --remaining[seq] == 0;
      prev = std::move(blocks);
      events.push_back(std::move(e));
    }
    o.sequences = n_seq;
    trace_requests = turns.size();
  }
  std::vector<uint64_t> seq_cells(o.sequences, 0);  // the most each sequence holds
  {
    std::vector<uint64_t> now(o.sequences, 0);
    for (const Event& e : events) {
      now[e.seq] = std::min<uint64_t>(now[e.seq], e.keep) + e.input.size() + e.gen;
      seq_cells[e.seq] = std::max(seq_cells[e.seq], now[e.seq]);
    }
  }
  const uint64_t max_cells = *std::max_element(seq_cells.begin(), seq_cells.end());
  if (max_cells > o.context) {
    if (o.trace_path.empty()) Die("the longest sequence would not fit --context");
    o.context = static_cast<uint32_t>((max_cells + 255) / 256 * 256);  // the trace sets it
  }
  uint32_t capacity = 0;
  if (o.trace_path.empty()) {  // as before the trace: room for the longest turns
    const uint64_t per_turn_max = o.prompt_tokens * 3 / 2 + o.gen_tokens;
    const uint64_t most = uint64_t{o.prefix_tokens} + uint64_t{o.turns} * per_turn_max;
    capacity = static_cast<uint32_t>(geo.blocks_for(most)) * o.sequences;
  } else {
    for (uint64_t c : seq_cells) capacity += static_cast<uint32_t>(geo.blocks_for(c));
  }

  Status st;
  auto client = Client::Connect({o.socket_path, geo, capacity, "cxltier-llama-" + o.mode}, &st);
  if (!client) Die("connect to " + o.socket_path + ": " + st.message);
  Pool pool(client.get(), o.mode == "copy", capacity, geo.block_bytes());

  Scores scores;
  scores.enabled = true;
  scores.n_layer = geo.layers;
  scores.n_head = geo.query_heads;
  scores.n_head_kv = geo.kv_heads;
  Scores quiet;  // the references run the same graph with the callback reading nothing
  llama_context* served = NewContext(model, o, &scores);
  std::vector<Sequence> seqs(o.sequences);
  for (uint32_t i = 0; i < o.sequences; ++i) {
    seqs[i].group = i + 1;
    seqs[i].reference = NewContext(model, o, &quiet);
  }

  Figures f;
  f.trace_requests = trace_requests;
  f.restores_from_tier.assign(client->tiers(), 0);
  f.restore_seconds_by_tier.assign(client->tiers(), 0.0);
  StateLayout layout;
  bool have_layout = false;
  std::vector<uint8_t> block(geo.block_bytes());
  std::vector<uint8_t> blob;
  llama_memory_t mem = llama_get_memory(served);

  auto hint = [&](Sequence& s, HintKind kind, std::span<const BlockKey> keys) {
    if (!o.hints) return;
    cxltier::wire::HintOk ok;
    if (Status h = client->Hint(s.group, kind, keys, &ok); !h.ok()) Die("hint: " + h.message);
    ++f.hints;
    f.hints_applied += ok.applied;
  };

  for (size_t ev = 0; ev < events.size(); ++ev) {
    Event& e = events[ev];
    {
      Sequence& s = seqs[e.seq];
      // The scheduler knows who runs after this one: that sequence's blocks come back ahead.
      if (ev + 1 < events.size() && events[ev + 1].seq != e.seq &&
          seqs[events[ev + 1].seq].cells > 0) {
        hint(seqs[events[ev + 1].seq], HintKind::kSoon, {});
      }

      // Restore: every block the turn keeps from whichever tier holds it, hash-checked.
      if (e.keep < s.cells) {  // the reference drops the same cells
        if (!llama_memory_seq_rm(llama_get_memory(s.reference), 0, static_cast<llama_pos>(e.keep),
                                 -1)) {
          Die("llama_memory_seq_rm refused to cut the reference");
        }
        s.cells = e.keep;
      }
      const uint32_t kept_cells = s.cells;
      if (s.cells > 0) {
        const size_t n_blocks = geo.blocks_for(s.cells);
        std::vector<std::vector<uint8_t>> got(n_blocks, std::vector<uint8_t>(block.size()));
        std::vector<const uint8_t*> ptrs;
        for (size_t b = 0; b < n_blocks; ++b) {
          const auto r0 = std::chrono::steady_clock::now();
          const Tier tier = pool.Read(s.slots[b], got[b].data());
          const uint64_t h = XXH3_64bits(got[b].data(), got[b].size());
          const double dt =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
          const unsigned t = cxltier::TierIndex(tier);
          if (t < f.restores_from_tier.size()) {
            ++f.restores_from_tier[t];
            f.restore_seconds_by_tier[t] += dt;
          }
          if (h != s.hashes[b]) ++f.corrupt_blocks;
          ++f.blocks_restored;
          ptrs.push_back(got[b].data());
        }
        blob = BlocksToState(layout, s.cells, ptrs);
        if (llama_state_seq_set_data_ext(served, blob.data(), blob.size(), 0, 0) != blob.size()) {
          Die("llama_state_seq_set_data_ext refused the restored state");
        }
        if (llama_memory_seq_pos_max(mem, 0) != static_cast<llama_pos>(s.cells) - 1) {
          Die("the restored sequence does not end where it did");
        }
      }

      // The turn: the user's tokens, then greedy generation.
      Decode(served, s.reference, e.input, n_vocab, &f, &scores, s.cells);
      s.cells += static_cast<uint32_t>(e.input.size());
      for (uint32_t g = 0; g < e.gen; ++g) {
        std::vector<llama_token> one{Argmax(llama_get_logits_ith(s.reference, -1), n_vocab)};
        Decode(served, s.reference, one, n_vocab, &f, &scores, s.cells);
        s.cells += 1;
      }
      ++f.turns;

      // Store: the sequence's KV out of llama.cpp into its blocks (from the
      // partial one the last turn left), then out of the context.
      blob.resize(llama_state_seq_get_size_ext(served, 0, 0));
      if (llama_state_seq_get_data_ext(served, blob.data(), blob.size(), 0, 0) != blob.size()) {
        Die("llama_state_seq_get_data_ext wrote a short state");
      }
      const ParsedState p = ParseState(blob, &layout, !have_layout);
      if (!have_layout) {
        have_layout = true;
        if (layout.block_bytes() != geo.block_bytes()) {
          Die("a block is " + std::to_string(layout.block_bytes()) +
              " bytes in llama.cpp's state, " + std::to_string(geo.block_bytes()) +
              " by the model's geometry (is the cache f16?)");
        }
      }
      if (p.cells != s.cells) Die("the state holds a different number of cells than decoded");
      // From the block holding the first new cell (the last partial one, when
      // nothing was dropped).
      const uint32_t first = static_cast<uint32_t>(
          s.slots.empty() ? 0 : std::min<size_t>(s.slots.size() - 1, kept_cells / kBlockTokens));
      const uint32_t blocks = static_cast<uint32_t>(geo.blocks_for(p.cells));
      std::vector<BlockKey> new_keys;
      for (uint32_t b = first; b < blocks; ++b) {
        StateToBlock(blob, layout, p, b, block.data());
        const BlockKey key = BlockKey::FromSequence(s.group, b);
        bool admitted = false;
        const uint32_t known = b < s.slots.size() ? s.slots[b] : UINT32_MAX;
        const uint32_t slot = pool.Store(key, known, block.data(), &admitted);
        const uint64_t h = XXH3_64bits(block.data(), block.size());
        if (admitted) {
          s.slots.push_back(slot);
          s.hashes.push_back(h);
          s.keys.push_back(key);
          new_keys.push_back(key);
          ++f.blocks_admitted;
        } else {
          s.hashes[b] = h;
        }
        ++f.blocks_stored;
      }
      // The turn's attention, one observation per block.
      for (uint32_t b = 0; b < blocks; ++b) {
        const size_t at = static_cast<size_t>(b) * scores.streams();
        if (at + scores.streams() > scores.acc.size()) break;
        const float mass = cxltier::AggregateStreams(
            geo, std::span<const float>(scores.acc.data() + at, scores.streams()),
            cxltier::Reduce::kMean);
        if (client->Observe(s.slots[b], std::min(mass, 65535.0f))) ++f.observations;
      }
      std::fill(scores.acc.begin(), scores.acc.end(), 0.0f);
      llama_memory_clear(mem, true);

      // The user reads the answer (idle), or the conversation ended (done).
      hint(s, e.last ? HintKind::kDone : HintKind::kIdle, new_keys);
      if (o.think_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o.think_ms));
    }
  }
  for (auto& s : seqs) {
    if (Status r = client->Release(s.keys); !r.ok()) Die("release: " + r.message);
    llama_free(s.reference);
  }
  llama_free(served);
  llama_model_free(model);

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string json = Json(o, f, geo.streams(), geo.block_bytes(), seconds);
  std::printf("%s\n", json.c_str());
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << json << "\n";
    if (!out) Die("cannot write " + o.json_path);
  }
  return f.corrupt_blocks == 0 && f.logit_rows_differing == 0 ? 0 : 2;
}
