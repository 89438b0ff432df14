# dyad_exports(<target> <map>): a shared library exports only what <map> (a
# GNU ld version script in cmake/exports/) lists.
#
# Every target is compiled with hidden visibility (top-level CMakeLists.txt),
# so only declarations marked DYAD_DLL_EXPORTED in include/dyad/ are visible.
# The version script also hides what visibility cannot: instantiations of
# std:: templates (libstdc++ declares namespace std visible) and the symbols
# of the static internal libraries linked in. tests/exports checks the result
# with nm. --no-undefined: a library must not rely on a symbol another
# library no longer exports (skipped for Python modules, whose interpreter
# symbols are undefined by design).
include_guard(GLOBAL)

function(dyad_exports target map)
  cmake_parse_arguments(E "ALLOW_UNDEFINED" "" "" ${ARGN})
  set(path ${CMAKE_SOURCE_DIR}/cmake/exports/${map})
  target_link_options(${target} PRIVATE "LINKER:--version-script=${path}")
  if(NOT E_ALLOW_UNDEFINED)
    target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  endif()
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${path})
endfunction()
