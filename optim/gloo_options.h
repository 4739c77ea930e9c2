// Options of the Gloo ddp engine (gloo_sync.h), kept apart so configs can name them without c10d.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace gossamer::optim {

struct GlooOptions {
  // Real peers: the rendezvous goes over the group's links (rank 0 serves a TCPStore on an ephemeral
  // port of store_host and tells the others where), and every new group makes a new process group.
  // Otherwise rank and size below, and a FileStore or a TCPStore at a fixed port.
  bool over_group_links = false;
  int rank = 0;
  int size = 1;
  std::string store_file;               // FileStore when set, else TCPStore
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 29500;     // rank 0 serves the TCPStore here
  std::string interface_host = "127.0.0.1";  // address Gloo's own connections use
  std::chrono::milliseconds timeout{60000};
};

}  // namespace gossamer::optim
