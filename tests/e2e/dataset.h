// The tests' sample datasets: the dataset writer of spdl-make-dataset (tools/datagen/dataset.h,
// library spdl_datagen), under the names the tests have always used.
#pragma once

#include "datagen/dataset.h"

namespace spdl::testdata {

using datagen::DatasetOptions;
using datagen::GeneratedImage;
using datagen::MakeImageFolder;
using datagen::SynthesizeImage;

}  // namespace spdl::testdata
