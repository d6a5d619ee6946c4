// Package monitortest plays gVisor's Sentry for tests of package monitor
// and of its users: it connects to a sink socket as runsc does (the
// remote sink's handshake) and writes real trace points (gVisor's
// protobuf types behind gVisor's wire header). No gVisor type crosses its
// API.
package monitortest
