# Flux (flux-core): the `flux://` store (src/kvs/flux), the Flux module
# dyad.so (src/flux) and the tests that run inside `flux start`.
#
# DYAD_ENABLE_FLUX (ON by default) builds them when `pkg-config flux-core`
# finds flux-core: a system install, or a prefix of
# scripts/build-flux-core.sh named by PKG_CONFIG_PATH (the Makefile passes
# the cached 0.73.0 prefix when it is built). Without flux-core the build goes
# on without them and the Flux tests are reported as skipped.
#
# Sets, for the rest of the tree:
#   DYAD_FLUX_BUILT     ON when the Flux parts are built (also in the cache,
#                       where the Makefile reads it)
#   PkgConfig::FLUX_CORE  the imported target to link (GLOBAL)
#   DYAD_FLUX_VERSION   flux-core's version
#   DYAD_FLUX_PREFIX    its prefix, DYAD_FLUX_LIBDIR its library directory
#   DYAD_FLUX_COMMAND   its `flux` program (tests run `flux start` with it)
# and dyad_flux_rpath(<targets>...), which adds flux-core's library directory
# to the installed RPATH of programs and modules that link it, when that
# directory is not one the loader searches anyway.
include_guard(GLOBAL)

option(DYAD_ENABLE_FLUX
       "Build the flux:// store and the Flux module (dyad.so) when pkg-config finds flux-core" ON)

set(DYAD_FLUX_BUILT OFF)
set(DYAD_FLUX_VERSION "")
set(DYAD_FLUX_PREFIX "")
set(DYAD_FLUX_LIBDIR "")
set(DYAD_FLUX_COMMAND "")
set(DYAD_FLUX_SKIP_REASON "")
if(NOT DYAD_ENABLE_FLUX)
  set(DYAD_FLUX_SKIP_REASON "switched off (DYAD_ENABLE_FLUX=OFF)")
else()
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(FLUX_CORE QUIET IMPORTED_TARGET GLOBAL flux-core)
  endif()
  if(FLUX_CORE_FOUND)
    set(DYAD_FLUX_VERSION ${FLUX_CORE_VERSION})
    # (pkg_check_modules' cached answers: a later reconfigure may run
    # without the PKG_CONFIG_PATH that found it)
    set(DYAD_FLUX_PREFIX ${FLUX_CORE_PREFIX})
    set(DYAD_FLUX_LIBDIR ${FLUX_CORE_LIBDIR})
    # (the prefix's own `flux`, not a cached one: the prefix may change)
    if(EXISTS ${DYAD_FLUX_PREFIX}/bin/flux)
      set(DYAD_FLUX_COMMAND ${DYAD_FLUX_PREFIX}/bin/flux)
    else()
      find_program(DYAD_FLUX_COMMAND flux NO_CACHE)
    endif()
    set(DYAD_FLUX_BUILT ON)
    message(STATUS "dyad: Flux parts enabled (flux-core ${DYAD_FLUX_VERSION} in ${DYAD_FLUX_PREFIX})")
  else()
    set(DYAD_FLUX_SKIP_REASON
        "no flux-core: pkg-config finds none (scripts/build-flux-core.sh builds one, the Makefile passes it)")
    message(STATUS "dyad: flux-core not found; building without the Flux parts")
  endif()
endif()
set(DYAD_FLUX_BUILT ${DYAD_FLUX_BUILT} CACHE INTERNAL "Flux parts built (cmake/DyadFlux.cmake)" FORCE)
set(DYAD_FLUX_SKIP_REASON "${DYAD_FLUX_SKIP_REASON}" CACHE INTERNAL
    "why the Flux parts are not built" FORCE)
set(DYAD_FLUX_FOUND_AT "${DYAD_FLUX_PREFIX} (flux-core ${DYAD_FLUX_VERSION})" CACHE INTERNAL
    "the flux-core the Flux parts are built with" FORCE)

function(dyad_flux_rpath)
  if(NOT DYAD_FLUX_BUILT OR NOT DYAD_FLUX_LIBDIR)
    return()
  endif()
  list(FIND CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES "${DYAD_FLUX_LIBDIR}" implicit)
  if(NOT implicit EQUAL -1 OR DYAD_FLUX_LIBDIR MATCHES "^/(usr/)?lib(64)?(/.*-linux-gnu)?$")
    return()
  endif()
  foreach(target ${ARGN})
    get_target_property(rpath ${target} INSTALL_RPATH)
    if(NOT rpath)
      set(rpath "")
    endif()
    list(APPEND rpath "${DYAD_FLUX_LIBDIR}")
    list(REMOVE_DUPLICATES rpath)
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "${rpath}")
  endforeach()
endfunction()
