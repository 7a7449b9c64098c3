# Writes the bytes of a file as a C array (the CUDA kernels' fatbin, which libtessera loads
# through the driver):  cmake -DIN=f -DOUT=f.c -DNAME=symbol -P TesseraEmbed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x..,){24})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}" "/* Generated at build time from ${IN}: do not edit. */\n"
  "_Alignas(16) const unsigned char ${NAME}[] = {\n${bytes}};\n")
