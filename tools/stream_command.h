// latent-tool stream: the elements' per-frame engine loop on host frames, timed (hooked into
// latent_tool.cpp). Takes latent_tool.cpp's parsed options ("--key value" -> options[key]),
// prints a table and one JSON line, and returns the process exit status.
#pragma once

#include <map>
#include <string>

int cmd_stream(const std::map<std::string, std::string>& options);

// The usage lines of this command, to append to latent-tool's usage text.
const char* stream_usage();
