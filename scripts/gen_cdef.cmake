# Extracts the FFI declarations of src/tpsh.h (between "CDEF BEGIN" and "CDEF END") into a Lua module
# returning them as a string, so that ffi.cdef reads the very text the C compiler reads.
file(READ ${IN} text)
string(FIND "${text}" "/* CDEF BEGIN */" begin)
string(FIND "${text}" "/* CDEF END */" end)
if(begin EQUAL -1 OR end EQUAL -1)
  message(FATAL_ERROR "${IN}: CDEF markers not found")
endif()
math(EXPR begin "${begin} + 16")
math(EXPR len "${end} - ${begin}")
string(SUBSTRING "${text}" ${begin} ${len} decls)
# TPSH_RO (empty for C) marks the fields Lua may only read: the FFI's copy says const there.
string(REPLACE "TPSH_RO" "const" decls "${decls}")
file(WRITE ${OUT} "-- Generated from src/tpsh.h by scripts/gen_cdef.cmake: do not edit.\nreturn [==[\n${decls}]==]\n")
