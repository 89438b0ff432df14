# What goes under <prefix>/share besides the libraries and programs: the man
# pages, bash completion, the documentation with the licence, and the
# systemd template unit with its environment-file example. Included from the
# top-level CMakeLists.txt when the programs are installed.
install(FILES docs/man/dyad.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES docs/man/dyad-service.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
# bash-completion loads completions/<command> on first use of <command>.
install(FILES packaging/bash-completion/dyad packaging/bash-completion/dyad-service
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)
install(FILES README.md LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md" PATTERN "man" EXCLUDE)

# The unit names the installed dyad-service by absolute path, so it is
# written at install time, for the prefix actually installed to
# (`cmake --install --prefix P` included).
set(DYAD_SYSTEMD_DIR ${CMAKE_INSTALL_DATADIR}/dyad/systemd)
install(CODE "
  set(DYAD_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
  configure_file(\"${CMAKE_CURRENT_SOURCE_DIR}/packaging/systemd/dyad@.service.in\"
                 \"${CMAKE_CURRENT_BINARY_DIR}/install-staging/dyad@.service\" @ONLY)")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/install-staging/dyad@.service
              packaging/systemd/dyad.env.example
        DESTINATION ${DYAD_SYSTEMD_DIR})
