/* PLACEHOLDER: replaced by the real code */
typedef int dp_placeholder_;
