# What goes under <prefix>/share besides the libraries and programs: the man
# pages, bash completion, the documentation with the licence, and the
# systemd template unit with its environment-file example, the Lmod module
# file and the uninstall script. Included from the
# top-level CMakeLists.txt when the programs are installed.
install(FILES docs/man/dyad.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES docs/man/dyad-service.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
# bash-completion loads completions/<command> on first use of <command>.
install(FILES packaging/bash-completion/dyad packaging/bash-completion/dyad-service
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)
install(FILES README.md LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md" PATTERN "man" EXCLUDE)

# Files that name the install prefix are written at install time, for the
# prefix actually installed to (`cmake --install --prefix P` included),
# straight into place (no staging file that two installs of one build tree
# into two prefixes would share), and added to the install manifest.
install(CODE "set(_DYAD_SRC \"${CMAKE_CURRENT_SOURCE_DIR}\")
  set(_DYAD_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(_DYAD_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(_DYAD_MANDIR \"${CMAKE_INSTALL_MANDIR}\")
  set(_DYAD_DATADIR \"${CMAKE_INSTALL_DATADIR}\")
  set(_DYAD_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")
  set(_DYAD_VERSION \"${PROJECT_VERSION}\")")
install(CODE [[
  # configure_file(IN OUT) into DESTDIR/PREFIX/REL, recorded like file(INSTALL) does.
  function(_dyad_install_configured in rel)
    set(out "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${rel}")
    message(STATUS "Installing: ${out}")
    configure_file("${in}" "${out}" @ONLY)
    set(CMAKE_INSTALL_MANIFEST_FILES ${CMAKE_INSTALL_MANIFEST_FILES} "${out}" PARENT_SCOPE)
  endfunction()

  # The systemd unit names the installed dyad-service by absolute path. Its
  # Documentation= names the man page by path when the prefix's man pages are
  # not where man looks without MANPATH (systemd-analyze verify runs man).
  set(DYAD_BINDIR "${CMAKE_INSTALL_PREFIX}/${_DYAD_BINDIR}")
  if(CMAKE_INSTALL_PREFIX MATCHES "^/usr(/local)?/?$")
    set(DYAD_UNIT_DOC "man:dyad-service(8)")
  else()
    set(DYAD_UNIT_DOC "file://${CMAKE_INSTALL_PREFIX}/${_DYAD_MANDIR}/man8/dyad-service.8")
  endif()
  string(APPEND DYAD_UNIT_DOC " file://${CMAKE_INSTALL_PREFIX}/${_DYAD_DOCDIR}/deployment.md")
  _dyad_install_configured("${_DYAD_SRC}/packaging/systemd/dyad@.service.in"
                           "${_DYAD_DATADIR}/dyad/systemd/dyad@.service")

  # The Lmod module file: share/lmod/dyad/<version>.lua. PYTHONPATH names
  # pydyad's site directory when pydyad was installed (python/CMakeLists.txt
  # sets _PYDYAD_SITE earlier in this install script).
  set(DYAD_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(DYAD_VERSION "${_DYAD_VERSION}")
  set(DYAD_BINDIR "${_DYAD_BINDIR}")
  set(DYAD_LIBDIR "${_DYAD_LIBDIR}")
  set(DYAD_MANDIR "${_DYAD_MANDIR}")
  set(DYAD_DOCDIR "${_DYAD_DOCDIR}")
  set(DYAD_LMOD_DIR "${_DYAD_DATADIR}/lmod")
  if(DEFINED _PYDYAD_SITE AND NOT _PYDYAD_SITE STREQUAL "")
    set(DYAD_LMOD_PYTHONPATH "prepend_path(\"PYTHONPATH\", pathJoin(prefix, \"${_PYDYAD_SITE}\"))")
  else()
    set(DYAD_LMOD_PYTHONPATH "-- (pydyad was not built: no PYTHONPATH)")
  endif()
  _dyad_install_configured("${_DYAD_SRC}/packaging/lmod/dyad.lua.in"
                           "${DYAD_LMOD_DIR}/dyad/${_DYAD_VERSION}.lua")
]])
set(DYAD_SYSTEMD_DIR ${CMAKE_INSTALL_DATADIR}/dyad/systemd)
install(FILES packaging/systemd/dyad.env.example DESTINATION ${DYAD_SYSTEMD_DIR})

# Uninstall without the build tree: the script, and (written last, by the
# top-level CMakeLists.txt) the manifest of this install beside it.
install(FILES cmake/DyadUninstall.cmake DESTINATION ${CMAKE_INSTALL_DATADIR}/dyad
        RENAME uninstall.cmake)
