// Package qmp is a client for the QEMU Machine Protocol over an inherited
// socket (one end of a socketpair whose other end QEMU got as
// `-chardev socket,id=qmp,fd=N,server=off -mon chardev=qmp,mode=control`).
//
// One reader goroutine owns the connection's read side: it matches replies
// to commands by id and forwards asynchronous events to a bounded channel.
// Writes are serialised by a mutex. Every call carries its own deadline from
// its context. File descriptors (for `getfd`, e.g. an outgoing migration
// file) travel by SCM_RIGHTS on the same sendmsg as the command.
//
// Everything QEMU sends is treated as untrusted-but-local: lines are capped
// at MaxMessageBytes and a malformed line ends the session.
package qmp
