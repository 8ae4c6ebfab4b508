// The API page (/api): Swagger UI, served by this server (static/vendor/swagger-ui, from the
// npm package swagger-ui-dist by scripts/vendor_swagger_ui.sh), over /openapi/openapi.json,
// with "Try it out" on every route. A request without an Authorization header of its own
// ("Authorize") carries the token typed into the dashboard, as the dashboard's own requests do.
import { accessToken } from "./common.js";

const mount = document.getElementById("swagger-ui");
if (mount && window.SwaggerUIBundle) {
  // Kept on window for the page's tests (which routes offer "Try it out": getConfigs()).
  window.servekitApi = window.SwaggerUIBundle({
    url: "/openapi/openapi.json",
    domNode: mount,
    deepLinking: true,
    validatorUrl: null, // Swagger's online validator: never (no request leaves this server)
    supportedSubmitMethods: ["get", "put", "post", "delete", "options", "head", "patch"],
    defaultModelsExpandDepth: 0,
    // The curl shown is the request before the interceptor: the dashboard's token is sent,
    // never written out on the page.
    showMutatedRequest: false,
    requestInterceptor: (request) => {
      const token = accessToken();
      const headers = request.headers || (request.headers = {});
      if (token && !Object.keys(headers).some((h) => h.toLowerCase() === "authorization")) {
        headers.Authorization = `Bearer ${token}`;
      }
      return request;
    },
  });
}
