package boot

// ValidHostname reports whether s is a valid hostname for the guest: one
// RFC 1123 label (1 to 63 letters, digits and hyphens, not starting or
// ending with a hyphen).
func ValidHostname(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-':
		default:
			return false
		}
	}
	return true
}
