/* PLACEHOLDER: replaced by the real layer */
typedef int dp_placeholder_;
