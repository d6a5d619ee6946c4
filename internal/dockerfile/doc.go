// Package dockerfile is the front end of template builds: it parses a
// Dockerfile into a Plan of expanded steps with cache keys, and writes the
// tar streams of COPY and ADD steps from a build context directory. It runs
// nothing: the builder (internal/sandbox) runs each step that changes the
// filesystem in a sandbox and saves its result under the step's Key.
//
// The subset is what real single-stage Dockerfiles use: FROM (once), RUN,
// COPY, ADD (local files and archives), ENV, ARG, WORKDIR, USER, EXPOSE,
// CMD, ENTRYPOINT, LABEL and MAINTAINER (as LABEL maintainer). Everything
// else is refused with its line number, never skipped: a second FROM,
// COPY --from, RUN --mount/--network/--security, ADD of a URL or git
// source, heredocs, ONBUILD, HEALTHCHECK, SHELL, STOPSIGNAL, VOLUME.
// Variables expand as in docker: ENV and ARG values (ENV wins) in every
// instruction but RUN, CMD and ENTRYPOINT, which the shell expands; ARGs
// before FROM are usable only in FROM unless redeclared after it.
//
// A build context is hostile input as much as the Dockerfile: every path is
// resolved through an os.Root on the context directory, so no step reads
// outside it; symlinks below a source are copied as symlinks, and a source
// that is a symlink is followed only while it stays inside (as docker
// follows sources), otherwise copied as the symlink; a step is
// capped at MaxStepBytes of file data and MaxStepEntries entries; an ADD
// archive's entries are re-rooted under the destination and a name that is
// absolute or has a ".." component is refused.
//
// Errors wrap errdefs.ErrInvalid (bad input) or errdefs.ErrResourceExhausted
// (limits); those about a line are *LineError, whose text starts with
// "Dockerfile:N:".
package dockerfile
