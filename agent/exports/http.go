package exports

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// Routes serves the runtime exports API on mux (the status socket).
func (x *Exports) Routes(mux *http.ServeMux) {
	mux.HandleFunc("PUT "+statusapi.ExportsPath+"{namespace}/{name}", x.handlePut)
	mux.HandleFunc("DELETE "+statusapi.ExportsPath+"{namespace}/{name}", x.handleDelete)
}

// maxExportBody bounds a runtime export's JSON (4096 endpoints fit comfortably).
const maxExportBody = 4 << 20

// handlePut is PUT /v1/exports/{namespace}/{name}: the body is a statusapi.Export whose
// namespace and name, when set, must be the path's.
func (x *Exports) handlePut(w http.ResponseWriter, r *http.Request) {
	var v statusapi.Export
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxExportBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		statusapi.WriteJSON(w, http.StatusBadRequest, statusapi.Error{Error: "decode export: " + err.Error()})
		return
	}
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	if v.Namespace == "" {
		v.Namespace = ns
	}
	if v.Name == "" {
		v.Name = name
	}
	if v.Namespace != ns || v.Name != name {
		statusapi.WriteJSON(w, http.StatusBadRequest, statusapi.Error{Error: fmt.Sprintf("export %s/%s sent to the path of %s/%s", v.Namespace, v.Name, ns, name)})
		return
	}
	res, err := x.PutExport(v)
	if err != nil {
		statusapi.WriteJSON(w, exportErrorCode(err), statusapi.Error{Error: err.Error()})
		return
	}
	statusapi.WriteJSON(w, http.StatusOK, res)
}

// handleDelete is DELETE /v1/exports/{namespace}/{name}.
func (x *Exports) handleDelete(w http.ResponseWriter, r *http.Request) {
	if err := x.DeleteExport(r.PathValue("namespace"), r.PathValue("name")); err != nil {
		statusapi.WriteJSON(w, exportErrorCode(err), statusapi.Error{Error: err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// exportErrorCode maps a runtime export error to its HTTP status.
func exportErrorCode(err error) int {
	switch {
	case errors.Is(err, errNoSuchExport):
		return http.StatusNotFound
	case errors.Is(err, ErrExportRefused):
		return http.StatusConflict
	case errors.Is(err, os.ErrPermission), strings.Contains(err.Error(), "runtime exports:"):
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}
