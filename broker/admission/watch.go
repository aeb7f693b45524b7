package admission

// WatchEncodings checks a watch's accept_encodings and says whether it lists name. Names the
// broker does not know are allowed (a newer agent may list them) but bounded.
func WatchEncodings(accept []string, name string) (bool, error) {
	if len(accept) > MaxWatchEncodings {
		return false, invalidf("accept_encodings", "", "accept_encodings: %d entries, at most %d", len(accept), MaxWatchEncodings)
	}
	found := false
	for i, a := range accept {
		if len(a) > MaxEncodingNameBytes {
			return false, invalidf("accept_encodings", a[:MaxEncodingNameBytes]+"...", "accept_encodings[%d]: %d bytes, at most %d", i, len(a), MaxEncodingNameBytes)
		}
		found = found || a == name
	}
	return found, nil
}
