// Package pkgdoc holds a test that every package in the module carries a
// package doc comment.
package pkgdoc
