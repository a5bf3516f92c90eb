# Turns a file into a C++ header holding its bytes: cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P embed_file.cmake
# Used for web/viewer.html, so the `qkv` binary carries the viewer page and needs no file beside it.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_file.cmake; do not edit.\n#pragma once\n#include <string_view>\n"
  "inline constexpr unsigned char ${NAME}_bytes[] = {\n${bytes}0x00};\n"
  "inline const std::string_view ${NAME}(reinterpret_cast<const char*>(${NAME}_bytes), ${size});\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
