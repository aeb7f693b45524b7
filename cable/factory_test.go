package cable

import (
	"errors"
	"testing"
)

// nilDriver is a driver type whose constructor fails, returning a nil pointer with the error.
type nilDriver struct{ Driver }

func TestConstructorReturnsANilDriverWithAnError(t *testing.T) {
	bad := errors.New("port: \"x\" is not a port")
	f := Constructor(func(LocalNode, Settings) (*nilDriver, error) { return nil, bad })
	d, err := f(LocalNode{}, nil)
	if !errors.Is(err, bad) || d != nil {
		t.Errorf("Constructor of a failing NewDriver = (%v, %v), want (nil, the error)", d, err)
	}
	ok := Constructor(func(LocalNode, Settings) (*nilDriver, error) { return &nilDriver{}, nil })
	if d, err := ok(LocalNode{}, nil); err != nil || d == nil {
		t.Errorf("Constructor of a working NewDriver = (%v, %v), want the driver", d, err)
	}
}

func TestCheckKeepsOnlyTheError(t *testing.T) {
	bad := errors.New("vni: 0 is out of range")
	check := Check(func(s Settings) (int, error) {
		if s["vni"] == "0" {
			return 0, bad
		}
		return 1, nil
	})
	if err := check(Settings{"vni": "0"}); !errors.Is(err, bad) {
		t.Errorf("Check of a refused setting = %v, want the parser's error", err)
	}
	if err := check(Settings{"vni": "7"}); err != nil {
		t.Errorf("Check of a good setting = %v", err)
	}
}
