// spdl-client's progress line: what it says and that it fits the terminal.
#include "progress.h"

#include <catch2/catch.hpp>

namespace spdl::client {
namespace {

TEST_CASE("the progress line shows the epoch, the share of the run, samples per second and the ETA") {
  ProgressState s;
  s.epoch = 1;  // the second of 4
  s.epochs = 4;
  s.batch_in_epoch = 5;
  s.batches_per_epoch = 10;
  s.batches = 15;
  s.samples = 480;
  s.seconds = 15;  // 1 s per batch: 25 batches left
  const std::string line = FormatProgress(s, 100);
  CHECK_THAT(line, Catch::StartsWith("epoch 2/4 ["));
  CHECK_THAT(line, Catch::Contains("] "
                                   " 38% 32 samples/s ETA 0:25"));
  CHECK(line.size() <= 99);
  CHECK(line.find('#') != std::string::npos);
}

TEST_CASE("an endless run shows the epoch's share and no ETA") {
  ProgressState s;
  s.epoch = 6;
  s.batch_in_epoch = 1;
  s.batches_per_epoch = 4;
  s.batches = 25;
  s.samples = 100;
  s.seconds = 2;
  const std::string line = FormatProgress(s, 80);
  CHECK_THAT(line, Catch::StartsWith("epoch 7 ["));
  CHECK_THAT(line, Catch::Contains(" 25% 50 samples/s"));
  CHECK(line.find("ETA") == std::string::npos);
}

TEST_CASE("a narrow terminal drops the bar and cuts the line to fit") {
  ProgressState s;
  s.epochs = 2;
  s.batches_per_epoch = 100;
  s.batch_in_epoch = 50;
  s.batches = 50;
  s.samples = 1000;
  s.seconds = 10;
  s.note = "daemon draining, 12 s left";
  CHECK(FormatProgress(s, 200).find("(daemon draining, 12 s left)") != std::string::npos);
  const std::string narrow = FormatProgress(s, 30);
  CHECK(narrow.size() <= 29);
  CHECK(narrow.find('[') == std::string::npos);
}

}  // namespace
}  // namespace spdl::client
