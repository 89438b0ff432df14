# dyad_backend(): the one CMake call of a backend folder.
#
#   dyad_backend(KIND transport|store NAME <name>
#                [OPTION <DYAD_ENABLE_X> DOC "<help>"] [PKG <pkg-config module>]
#                [DLOPEN <symbol>...] SOURCES <files>...)
#
# DLOPEN: compile against PKG's headers without linking its library; the
# backend opens it with dlopen at first use and binds these symbols. Its
# sources get DYAD_<NAME>_SONAME, DYAD_<NAME>_LIBDIR and, per symbol,
# DYAD_<SYMBOL>_VERSION: the version a direct link would bind (the
# library's default, read with nm; "" when it has none).
#
# Compiles the folder's row.cc into dyad_common (always, with
# DYAD_BACKEND_BUILT=0/1, so every program knows the backend and whether it
# is here) and, when the switch is on and the dependency found, its SOURCES
# into dyad_transport or dyad_kvs, defining DYAD_HAVE_<NAME>. The rows file
# written by dyad_write_backend_lists() lists every folder; the factories
# file lists the backends built, each providing
#   Result<std::unique_ptr<Transport>> CreateTransport_<name>(const TransportOptions&)
#   Result<std::unique_ptr<Kvs>> OpenKvs_<name>(const std::string& url, const KvsOptions&)
include_guard(GLOBAL)

# The DLOPEN half of dyad_backend(): headers, libdl, and where the library
# and its symbol versions are (pkg_check_modules' variables are in the
# caller's scope, a function's).
macro(dyad_backend_dlopen lib upper sources symbols)
  target_include_directories(${lib} SYSTEM PUBLIC ${DYAD_DEP_${upper}_INCLUDE_DIRS})
  target_link_libraries(${lib} PUBLIC ${CMAKE_DL_LIBS})
  list(GET DYAD_DEP_${upper}_LINK_LIBRARIES 0 dl_path)
  get_filename_component(dl_real "${dl_path}" REALPATH)
  get_filename_component(dl_dir "${dl_path}" DIRECTORY)
  execute_process(COMMAND ${CMAKE_OBJDUMP} -p "${dl_real}" OUTPUT_VARIABLE dl_dump ERROR_QUIET)
  set(CMAKE_MATCH_1 "")
  string(REGEX MATCH "SONAME +([^\n ]+)" dl_match "${dl_dump}")
  if(NOT CMAKE_MATCH_1)
    message(FATAL_ERROR "dyad: cannot read the SONAME of ${dl_real} (${CMAKE_OBJDUMP} -p)")
  endif()
  set(dl_defs "DYAD_${upper}_SONAME=\"${CMAKE_MATCH_1}\"" "DYAD_${upper}_LIBDIR=\"${dl_dir}\"")
  execute_process(COMMAND ${CMAKE_NM} -D --defined-only "${dl_real}" OUTPUT_VARIABLE dl_syms
                  ERROR_QUIET)
  foreach(dl_sym ${symbols})
    set(CMAKE_MATCH_1 "")
    string(REGEX MATCH " ${dl_sym}@@([A-Za-z0-9_.]+)" dl_match "${dl_syms}")
    string(TOUPPER "${dl_sym}" dl_upper)
    list(APPEND dl_defs "DYAD_${dl_upper}_VERSION=\"${CMAKE_MATCH_1}\"")
  endforeach()
  set_source_files_properties(${sources} TARGET_DIRECTORY ${lib} PROPERTIES COMPILE_DEFINITIONS
                                                                           "${dl_defs}")
endmacro()

function(dyad_backend)
  cmake_parse_arguments(B "" "KIND;NAME;OPTION;DOC;PKG" "SOURCES;DLOPEN" ${ARGN})
  if(B_KIND STREQUAL "transport")
    set(lib dyad_transport)
  elseif(B_KIND STREQUAL "store")
    set(lib dyad_kvs)
  else()
    message(FATAL_ERROR "dyad_backend(${B_NAME}): KIND must be transport or store")
  endif()
  string(TOUPPER "${B_NAME}" upper)
  set(built ON)
  if(B_OPTION)
    option(${B_OPTION} "${B_DOC}" ON)
    if(NOT ${B_OPTION})
      set(built OFF)
      message(STATUS "dyad: ${B_KIND} ${B_NAME} disabled (${B_OPTION}=OFF)")
    endif()
  endif()
  if(built AND B_PKG)
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
      pkg_check_modules(DYAD_DEP_${upper} QUIET IMPORTED_TARGET ${B_PKG})
    endif()
    if(NOT DYAD_DEP_${upper}_FOUND)
      set(built OFF)
      message(STATUS "dyad: ${B_PKG} not found; building without the ${B_NAME} ${B_KIND}")
    endif()
  endif()

  set(row ${CMAKE_CURRENT_SOURCE_DIR}/row.cc)
  target_sources(dyad_common PRIVATE ${row})
  if(built)
    set_source_files_properties(${row} TARGET_DIRECTORY dyad_common
                                PROPERTIES COMPILE_DEFINITIONS DYAD_BACKEND_BUILT=1)
  else()
    set_source_files_properties(${row} TARGET_DIRECTORY dyad_common
                                PROPERTIES COMPILE_DEFINITIONS DYAD_BACKEND_BUILT=0)
  endif()
  set_property(GLOBAL APPEND PROPERTY DYAD_BACKEND_ROWS "${B_KIND}:${B_NAME}")
  if(NOT built)
    return()
  endif()
  list(TRANSFORM B_SOURCES PREPEND ${CMAKE_CURRENT_SOURCE_DIR}/)
  target_sources(${lib} PRIVATE ${B_SOURCES})
  if(B_PKG AND B_DLOPEN)
    dyad_backend_dlopen(${lib} ${upper} "${B_SOURCES}" "${B_DLOPEN}")
    message(STATUS "dyad: ${B_KIND} ${B_NAME} enabled (${B_PKG} ${DYAD_DEP_${upper}_VERSION}, "
                   "opened at first use)")
  elseif(B_PKG)
    target_link_libraries(${lib} PUBLIC PkgConfig::DYAD_DEP_${upper})
    message(STATUS "dyad: ${B_KIND} ${B_NAME} enabled (${B_PKG} ${DYAD_DEP_${upper}_VERSION})")
  endif()
  target_compile_definitions(${lib} PUBLIC DYAD_HAVE_${upper}=1)
  set_property(GLOBAL PROPERTY DYAD_HAVE_${upper} ON)
  set_property(GLOBAL APPEND PROPERTY DYAD_BUILT_${B_KIND}S ${B_NAME})
endfunction()

# Writes the generated lists (only when their content changes, so a
# reconfigure does not rebuild everything).
function(dyad_write_backend_lists dir)
  get_property(rows GLOBAL PROPERTY DYAD_BACKEND_ROWS)
  set(text "// Generated by cmake/DyadBackend.cmake: one line per backend folder.\n")
  foreach(r ${rows})
    string(REPLACE ":" ";" parts "${r}")
    list(GET parts 0 kind)
    list(GET parts 1 name)
    string(APPEND text "DYAD_BACKEND_ROW(${kind}, ${name})\n")
  endforeach()
  file(CONFIGURE OUTPUT ${dir}/dyad_backend_rows.inc CONTENT "${text}")
  foreach(kind transport store)
    get_property(built GLOBAL PROPERTY DYAD_BUILT_${kind}S)
    set(text "// Generated by cmake/DyadBackend.cmake: the ${kind}s compiled in.\n")
    foreach(name ${built})
      string(APPEND text "DYAD_BUILT_BACKEND(${name})\n")
    endforeach()
    file(CONFIGURE OUTPUT ${dir}/dyad_built_${kind}s.inc CONTENT "${text}")
  endforeach()
endfunction()
