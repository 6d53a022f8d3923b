// data/tensorboard.h: writing scalars in TensorBoard's event-file format, as PyTorch's
// torch.utils.tensorboard.SummaryWriter writes them, without TensorFlow or protobuf.
//
//   tensorboard::SummaryWriter writer("runs/gpt");       // runs/gpt/events.out.tfevents.<time>.<host>.<pid>.<n>
//   writer.add_scalar("Train/loss", loss, step);
//   writer.flush();                                       // `tensorboard --logdir runs` shows it
//
// The file is a sequence of TFRecords: a little-endian uint64 length, the masked CRC-32C of those
// 8 bytes, the payload, the masked CRC-32C of the payload. Each payload is a serialized
// tensorflow.Event protocol buffer; the first holds file_version "brain.Event:2", the others a
// Summary with one Value {tag, simple_value}. Those three messages are the whole of the protobuf
// that is needed, and they are encoded here by hand (docs/profiling.md walks through the bytes).
// Records are appended whole; a reader (read_tf_records, TensorBoard's) stops at a record cut off
// by a crash, so what was flushed before it stays readable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses: crc32c("123456789")
// is 0xE3069283.
uint32_t crc32c(const void* data, size_t n);
// TFRecord's masked form: rotate right by 15 bits, add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

// The serialized tensorflow.Event of one scalar (the payload of its record).
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
// The serialized tensorflow.Event that opens a file: file_version "brain.Event:2".
std::string file_version_event(double wall_time);
// One TFRecord around a payload.
std::string tf_record(std::string_view payload);
// The payloads of an event file's records, in order, each record's two CRCs checked: a corrupt one
// is an Error naming its offset. A record cut off at the end (a writer that stopped mid-record)
// ends the list, as TensorBoard's reader stops there.
std::vector<std::string> read_tf_records(const std::string& path);

class SummaryWriter {
 public:
  // Creates log_dir (and its parents) and a new event file in it; an Error when it cannot.
  explicit SummaryWriter(const std::string& log_dir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // wall_time: seconds since the Unix epoch; negative: now. The tag must be non-empty UTF-8.
  void add_scalar(std::string_view tag, double value, int64_t step, double wall_time = -1);
  void flush();  // what was added is on disk (the C library's buffer written out)
  void close();  // flushes and closes; later adds are Errors
  const std::string& path() const { return path_; }  // the event file

 private:
  void write(const std::string& record);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace kiln::tensorboard
