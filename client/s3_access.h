// The trainer's object-storage access, read by the client and sent with a job (SubmitJob.s3):
// credentials from the environment (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY [+ AWS_SESSION_TOKEN]),
// else from the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials of
// the calling user; profile AWS_PROFILE, else "default"); the endpoint from AWS_ENDPOINT_URL_S3,
// else AWS_ENDPOINT_URL; the region from AWS_REGION, else AWS_DEFAULT_REGION.
// Thread safety: reads the environment (getenv) and a file; call it where nothing modifies the
// environment concurrently.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "proto/control.pb.h"

namespace spdl::client {

// Fills *out with what is found; leaves the fields of what is not found empty. Never fails: a
// missing or unreadable credentials file is no credentials (the daemon then signs nothing and the
// store answers for itself). `home` = "" reads $HOME (else the user's passwd entry).
void LoadS3Access(proto::S3Access* out, const std::string& home = "");

// Whether a job may read object storage, so that its submission carries the trainer's S3 access
// (a job without an s3:// source sends none): "s3://" in the config text or an override value, or
// in a list file the config names (a `list:` key, or an override of a path ending in `list`), read
// here as the trainer. A list that cannot be read here counts as a yes (the daemon reads it and
// may need the access). REQUIRES: nothing modifies those files concurrently (a race only decides
// whether access is sent).
bool JobMayUseS3(const std::string& config_yaml, const std::vector<std::pair<std::string, std::string>>& overrides);

// Parses the INI text of a shared credentials file: the keys of [profile]. Exposed for tests.
void ParseCredentialsFile(const std::string& text, const std::string& profile, proto::S3Access* out);

}  // namespace spdl::client
